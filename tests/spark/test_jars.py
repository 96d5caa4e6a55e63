"""The shaded plugin jars hold only Sluice's own classes and relocated third-party ones.

Anything else (an unrelocated io.netty class, a Spark or Scala class) could clash with what Spark
puts on the class path. Needs no Spark: reads the jars that `mvn install` wrote.
"""

import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["sluice-spark-3.5", "sluice-spark-4"]


def shaded_jar(module):
    jars = sorted((ROOT / "clients/jvm" / module / "target").glob(f"{module}-*-shaded.jar"))
    if not jars:
        pytest.fail(f"no {module} shaded jar: run (cd clients/jvm && mvn -q -B install -DskipTests)")
    return jars[-1]


@pytest.mark.parametrize("module", MODULES)
def test_every_class_is_sluice_or_relocated(module):
    with zipfile.ZipFile(shaded_jar(module)) as z:
        names = z.namelist()
    classes = [n for n in names if n.endswith(".class")]
    assert any(n.startswith("io/sluice/spark/SluiceShuffleManager") for n in classes)
    assert any(n.startswith("io/sluice/shaded/io/netty/") for n in classes)
    stray = [n for n in classes if not n.startswith("io/sluice/")]
    assert not stray, f"unrelocated classes in {module}: {stray[:10]}"


@pytest.mark.parametrize("module", MODULES)
def test_native_epoll_renamed_with_the_relocation_prefix(module):
    with zipfile.ZipFile(shaded_jar(module)) as z:
        native = [n for n in z.namelist() if n.startswith("META-INF/native/") and n[-1] != "/"]
    # Netty derives the prefix from its relocated package: io.sluice.shaded. -> io_sluice_shaded_
    assert "META-INF/native/libio_sluice_shaded_netty_transport_native_epoll_x86_64.so" in native
    assert all("io_sluice_shaded_netty_" in n for n in native), native


@pytest.mark.parametrize("module", MODULES)
def test_no_third_party_service_registrations(module):
    with zipfile.ZipFile(shaded_jar(module)) as z:
        services = [n for n in z.namelist()
                    if n.startswith("META-INF/services/") and n[-1] != "/"]
    assert services == [], services


@pytest.mark.parametrize("module", MODULES)
def test_netty_tcnative_renamed_with_the_relocation_prefix(module):
    """netty-tcnative's BoringSSL (the default TLS engine) loads under the relocated package
    only if its library carries the same prefix; else the client falls back to the JDK's."""
    with zipfile.ZipFile(shaded_jar(module)) as z:
        names = z.namelist()
    assert "META-INF/native/libio_sluice_shaded_netty_tcnative_linux_x86_64.so" in names
    assert any(n.startswith("io/sluice/shaded/io/netty/internal/tcnative/SSL") for n in names)
