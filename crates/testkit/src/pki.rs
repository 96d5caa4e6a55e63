//! A throw-away certificate authority (rcgen) and the certificates it signs, written as PEM
//! files: for `sluice local --tls`, `sluice bench fetch --tls` and the TLS tests.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// A CA whose key lives only in this process, and the PEM files it wrote.
pub struct TestPki {
    dir: PathBuf,
    name: String,
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl TestPki {
    /// A new CA named `name`; writes its certificate to `DIR/NAME-ca.pem` (mode 0644: only
    /// certificates and keys of throw-away clusters go here).
    pub fn new(dir: &Path, name: &str) -> anyhow::Result<TestPki> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, format!("{name} throw-away CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key)?;
        let pki = TestPki { dir: dir.to_owned(), name: name.to_owned(), cert, key };
        std::fs::write(pki.ca_file(), pki.cert.pem()).context("writing the CA certificate")?;
        Ok(pki)
    }

    /// The CA's certificate (PEM), what clients trust.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// Issues a certificate for `names` (IP addresses or DNS names), valid now or, with
    /// `expired`, only in 2019; writes `DIR/STEM.pem` and `DIR/STEM-key.pem` and returns their
    /// paths (certificate, key).
    pub fn issue(
        &self,
        stem: &str,
        names: &[&str],
        expired: bool,
    ) -> anyhow::Result<(PathBuf, PathBuf)> {
        let key = KeyPair::generate()?;
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name.push(DnType::CommonName, stem);
        if expired {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2019, 12, 31);
        }
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        let (cert_file, key_file) =
            (self.dir.join(format!("{stem}.pem")), self.dir.join(format!("{stem}-key.pem")));
        std::fs::write(&cert_file, cert.pem()).context("writing a certificate")?;
        std::fs::write(&key_file, key.serialize_pem()).context("writing a key")?;
        Ok((cert_file, key_file))
    }
}
