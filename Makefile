# Two commands for a new machine:
#   make run    the main job: an embedded coordinator + 2 servers run a verified shuffle
#   make test   every test: Rust (unit, property, vectors, integration), Java, Spark jobs, the
#               Helm chart (tests/deploy/run.sh)
# Both install what they need beyond the machine's Rust, Java 17, Maven, Python and Go: crates,
# Maven artifacts, the pyspark virtualenvs, helm and kubeconform are fetched by the targets
# themselves.

CARGO ?= cargo
SLUICE := target/release/sluice

.PHONY: run test test-rust test-jvm test-spark test-deploy build deps lint bench vectors fuzz browser status-page-screenshot s3-server hdfs-server

deps:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }

build: deps
	$(CARGO) build --release -p sluice

run: build
	$(SLUICE) local

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: test-rust test-jvm test-spark test-deploy

# Debian's chromium, for the status page's browser test (crates/sluice/tests/status_page.rs).
# Without it that test is reported as ignored, "STATUS PAGE BROWSER TEST NOT RUN".
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
	  || echo "STATUS PAGE BROWSER TEST NOT RUN: chromium could not be installed (apt-get install chromium)" >&2; }

# The S3-compatible server the object-store tests start (crates/sluice/tests/object_store.rs):
# s3s-fs from crates.io, built unoptimised (`--debug`: the tests need it to be right, not fast)
# into target/tools/bin (about 1 minute on 2 cores, once, where an optimised build took 4.5; a
# newer s3s-fs wants a newer rustc than 1.95). Without it those tests are reported as ignored,
# "OBJECT STORE TESTS NOT RUN".
S3S_FS := target/tools/bin/s3s-fs
S3S_FS_VERSION := 0.14.1

s3-server: deps
	@test -x $(S3S_FS) || $(CARGO) install s3s-fs --version $(S3S_FS_VERSION) --features binary --locked --debug --root target/tools \
	  || echo "OBJECT STORE TESTS NOT RUN: s3s-fs could not be installed (cargo install s3s-fs --features binary)" >&2

# The MiniDFSCluster the HDFS test starts (crates/sluice/tests/hdfs.rs): tests/hdfs compiled
# against hadoop-client-minicluster from Maven Central (about 105 MB of jars into ~/.m2, once), its class
# path written to tests/hdfs/target/classpath.txt. Without it, or without Java, that test is
# reported as ignored, "HDFS TESTS NOT RUN".
hdfs-server:
	@mvn -q -B -f tests/hdfs/pom.xml compile \
	  || echo "HDFS TESTS NOT RUN: the MiniDFS could not be built (mvn -f tests/hdfs/pom.xml compile)" >&2

test-rust: deps browser s3-server hdfs-server
	$(CARGO) test --workspace

# Runs the browser test and replaces docs/status-page.png with its screenshot.
status-page-screenshot: deps browser
	SLUICE_SCREENSHOT_TO=docs/status-page.png $(CARGO) test -p sluice --test status_page -- --nocapture

test-jvm:
	mvn -q -B -f clients/jvm/pom.xml verify

test-spark: build s3-server
	bash tests/spark/run.sh

# The chart's tests start the binary with the rendered configs, hence build.
test-deploy: build
	bash tests/deploy/run.sh

vectors:
	$(CARGO) run -q -p sluice-proto --example gen_vectors

bench: build
	$(SLUICE) bench transport
	$(SLUICE) bench push
	$(SLUICE) bench fetch
	$(SLUICE) local --bytes 2G

fuzz:
	cd fuzz && $(CARGO) +nightly fuzz run frame_decode -- -max_total_time=300
	cd fuzz && $(CARGO) +nightly fuzz run core_ops -- -max_total_time=300
