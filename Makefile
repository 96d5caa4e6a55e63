# Two commands for a new machine:
#   make run    the main job: an embedded coordinator + 2 servers run a verified shuffle
#   make test   every test: Rust (unit, property, vectors, integration), Java, Spark jobs
# Both install what they need beyond the machine's Rust, Java 17, Maven and Python: crates,
# Maven artifacts and the pyspark virtualenvs are fetched by the targets themselves.

CARGO ?= cargo
SLUICE := target/release/sluice

.PHONY: run test test-rust test-jvm test-spark build deps lint bench vectors fuzz

deps:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }

build: deps
	$(CARGO) build --release -p sluice

run: build
	$(SLUICE) local

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: test-rust test-jvm test-spark

test-rust: deps
	$(CARGO) test --workspace

test-jvm:
	mvn -q -B -f clients/jvm/pom.xml verify

test-spark: build
	bash tests/spark/run.sh

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
