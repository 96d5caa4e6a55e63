#!/usr/bin/env bash
# Builds Apache Celeborn's server from a release tag's source and fetches its Spark client jar
# from Maven Central, for bench/celeborn/cluster.sh and the Spark benchmarks' `celeborn` mode.
# Not part of `make test` or CI: it downloads a few hundred MB and builds for 10-30 minutes.
#
#   CELEBORN_TAG     release tag (default v0.5.4: the newest whose Spark client this machine's
#                    Maven Central mirror holds; it has no Spark 4 client of any version, so
#                    the Celeborn runs are on Spark 3.5: SLUICE_SPARK_VENV=spark35)
#   CELEBORN_GIT     where to clone it from (default https://github.com/apache/celeborn.git;
#                    a local mirror, e.g. /work/.mirror/apache+celeborn/repo, works offline)
#   CELEBORN_PROFILE Maven profile of the server build (default: none, Celeborn's default, Scala
#                    2.12; the server speaks the same protocol to every client)
#   CELEBORN_MVN_ARGS extra Maven arguments of the server build (default
#                    -Dmaven.plugin.silencer.version=1.7.17: the mirror lacks the silencer
#                    compiler plugin version the tags name for Scala 2.12.18)
#   CELEBORN_CLIENT  the client artifact on Maven Central (default
#                    celeborn-client-spark-3-shaded_2.12; a Spark 4 one is
#                    celeborn-client-spark-4-shaded_2.13, from 0.6.0)
#   CELEBORN_WORK    build and install directory (default bench/celeborn/.work)
#
# Needs: git, a JDK (17), Maven 3.8+ and network access to Maven Central. Prints
# CELEBORN_HOME=... and CELEBORN_CLIENT_JAR=... at the end; fails with the missing piece named.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TAG="${CELEBORN_TAG:-v0.5.4}"
GIT="${CELEBORN_GIT:-https://github.com/apache/celeborn.git}"
PROFILE="${CELEBORN_PROFILE:-}"
ARTIFACT="${CELEBORN_CLIENT:-celeborn-client-spark-3-shaded_2.12}"
MVN_ARGS="${CELEBORN_MVN_ARGS--Dmaven.plugin.silencer.version=1.7.17}"
WORK="${CELEBORN_WORK:-$HERE/.work}"
VERSION="${TAG#v}"

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "celeborn setup: '$1' is missing ($2)" >&2; exit 2; }
}
need git "to fetch Celeborn's source"
need java "a JDK 17 builds and runs Celeborn"
need mvn "Maven builds Celeborn and fetches its client jar"

mkdir -p "$WORK"
SRC="$WORK/celeborn-$VERSION"
if [[ ! -d "$SRC/.git" ]]; then
  echo "cloning $GIT at $TAG into $SRC"
  git clone --quiet --depth 1 --branch "$TAG" "$GIT" "$SRC" \
    || { echo "celeborn setup: cannot clone tag $TAG from $GIT" >&2; exit 2; }
fi

# make-distribution.sh names the jars it copies after the last line of `mvn help:evaluate`;
# Debian's Maven 3.8 ends its output with a colour reset (ESC[0m) on a line of its own whatever
# -B or -Dstyle.color say, so the build goes through a wrapper that strips colour codes and
# empty lines from Maven's output (the exit status kept).
MVN_PLAIN="$WORK/mvn-plain"
cat > "$MVN_PLAIN" <<'WRAPPER'
#!/usr/bin/env bash
set -o pipefail
mvn "$@" | sed -u -e 's/\x1b\[[0-9;]*m//g' -e '/^[[:space:]]*$/d'
WRAPPER
chmod +x "$MVN_PLAIN"

DIST="$SRC/dist"
if [[ ! -x "$DIST/sbin/start-master.sh" || -z "$(ls "$DIST"/master-jars/celeborn-master_*-"$VERSION".jar 2>/dev/null)" ]]; then
  echo "building Celeborn $VERSION's server (profile: ${PROFILE:-default}), log: $WORK/build.log"
  rm -rf "$DIST"
  (cd "$SRC" && ./build/make-distribution.sh --mvn "$MVN_PLAIN" ${PROFILE:+"-P$PROFILE"} -B $MVN_ARGS) \
    > "$WORK/build.log" 2>&1 \
    || { echo "celeborn setup: the build failed; the end of $WORK/build.log:" >&2
         tail -30 "$WORK/build.log" >&2; exit 1; }
fi
for f in sbin/start-master.sh "master-jars/celeborn-master_*-$VERSION.jar" \
         "worker-jars/celeborn-worker_*-$VERSION.jar"; do
  compgen -G "$DIST/$f" >/dev/null \
    || { echo "celeborn setup: no $DIST/$f after the build (see $WORK/build.log)" >&2; exit 1; }
done

JAR="$WORK/$ARTIFACT-$VERSION.jar"
if [[ ! -f "$JAR" ]]; then
  echo "fetching org.apache.celeborn:$ARTIFACT:$VERSION from Maven Central"
  "$MVN_PLAIN" -q -B dependency:copy "-Dartifact=org.apache.celeborn:$ARTIFACT:$VERSION" \
    "-DoutputDirectory=$WORK" >/dev/null \
    || { echo "celeborn setup: cannot fetch $ARTIFACT $VERSION from Maven Central" >&2; exit 2; }
fi
echo "CELEBORN_HOME=$DIST"
echo "CELEBORN_CLIENT_JAR=$JAR"
