//! Golden vectors: the files in `protocol/vectors/` must equal what the generator makes today, and
//! every case must decode (or fail) exactly as its manifest says.

mod support;

use bytes::BytesMut;
use serde_json::Value;
use sluice_proto::batch::validate_batches;
use sluice_proto::{encode_frame, parse, Frame, Message, ProtoError};
use support::vectors_gen::{cases, manifest};

fn vectors_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../protocol/vectors")
}

/// Decodes one file the way a receiver would; `Ok(None)` = incomplete.
fn decode(bytes: &[u8], max: u32, validate: bool) -> Result<Option<Frame>, ProtoError> {
    let mut buf = BytesMut::from(bytes);
    let Some(frame) = parse(&mut buf, max)? else { return Ok(None) };
    assert!(buf.is_empty(), "a vector file holds exactly one frame");
    if validate {
        let sections: Vec<&[u8]> = match &frame.message {
            Message::PushMerged(p) => p
                .entries
                .iter()
                .map(|s| &frame.body[s.offset as usize..(s.offset + s.length) as usize])
                .collect(),
            _ => vec![&frame.body[..]],
        };
        for s in sections {
            validate_batches(s, |_| {})?;
        }
    }
    Ok(Some(frame))
}

#[test]
fn files_match_the_generator() {
    let cases = cases();
    let dir = vectors_dir();
    for c in &cases {
        let on_disk = std::fs::read(dir.join(format!("{}.bin", c.name)))
            .unwrap_or_else(|e| panic!("{}: {e} (run the gen_vectors example)", c.name));
        assert_eq!(on_disk, c.bytes, "{}.bin differs from the generator", c.name);
    }
    let m = std::fs::read_to_string(dir.join("manifest.json")).expect("manifest.json");
    assert_eq!(m, manifest(&cases), "manifest.json differs from the generator");
    let files = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "bin"));
    assert_eq!(files.count(), cases.len(), "stray .bin files in protocol/vectors");
}

#[test]
fn every_case_behaves_as_the_manifest_says() {
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(vectors_dir().join("manifest.json")).unwrap(),
    )
    .unwrap();
    let cases = doc["cases"].as_array().unwrap();
    let (mut ok, mut bad) = (std::collections::HashSet::new(), 0);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let bytes = std::fs::read(vectors_dir().join(c["file"].as_str().unwrap())).unwrap();
        let max = c["max_frame_bytes"].as_u64().unwrap() as u32;
        let result = decode(&bytes, max, c["validate_batches"].as_bool().unwrap());
        match c["expect"].as_str().unwrap() {
            "ok" => {
                let f = result.unwrap_or_else(|e| panic!("{name}: {e}")).expect(name);
                assert_eq!(f.message.msg_type().name(), c["message"], "{name}");
                assert_eq!(f.request_id as u64, c["request_id"].as_u64().unwrap(), "{name}");
                assert_eq!(serde_json::to_value(&f.message).unwrap(), c["fields"], "{name}");
                assert_eq!(hex::encode(&f.body), c["body_hex"].as_str().unwrap(), "{name}");
                assert_eq!(
                    encode_frame(f.request_id, &f.message, &f.body).to_vec(),
                    bytes,
                    "{name}"
                );
                ok.insert(f.message.msg_type() as u8);
            }
            "incomplete" => {
                assert!(matches!(result, Ok(None)), "{name}: expected incomplete, got {result:?}");
                bad += 1;
            }
            "error" => {
                let e = result.expect_err(name);
                assert_eq!(
                    e.code().as_u16() as u64,
                    c["error_code"].as_u64().unwrap(),
                    "{name}: {e}"
                );
                bad += 1;
            }
            other => panic!("{name}: unknown expect {other}"),
        }
    }
    // A valid vector of every message type, and at least ten malformed ones.
    assert_eq!(ok.len(), sluice_proto::MsgType::ALL.len());
    assert!(bad >= 10, "only {bad} malformed vectors");
}
