"""What the chart renders, beyond schema validity (run.sh checks that with kubeconform)."""

import json
import re
import tomllib

import pytest
import yaml

from conftest import CHART_SOURCE, FULL_VALUES, ROOT, parse

FULL_VALUES_DOC = yaml.safe_load(FULL_VALUES.read_text())


def test_default_objects(default):
    assert default.kinds() == [
        "ConfigMap",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "Service",
        "StatefulSet",
        "StatefulSet",
    ]


def test_full_objects(full):
    # Both secrets exist already (existingSecret): the chart renders none.
    assert full.kinds() == [
        "ConfigMap",
        "ConfigMap",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "Service",
        "Service",
        "ServiceMonitor",
        "StatefulSet",
        "StatefulSet",
    ]


def test_rendered_the_same_for_every_kubernetes_version(renders):
    by_values = {}
    for (values, _), render in renders.items():
        kinds = render.kinds()
        assert by_values.setdefault(values, kinds) == kinds


def test_server_toml(render):
    toml = tomllib.loads(render.config("server.toml"))
    container = render.container(render.server)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert toml["listen"] == f"0.0.0.0:{ports['sluice']}"
    # Helm reads YAML numbers as floats: sizes and times must come out as TOML integers, or
    # the binary refuses the file.
    for key, value in [*toml.items(), *toml["transport"].items()]:
        if key.endswith(("_bytes", "_ms", "_per_dir", "_connections", "_nice")):
            assert type(value) is int, f"{key} = {value!r}"
    assert type(toml["flush_watermark"]) is float
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert toml["data_dirs"] and set(toml["data_dirs"]) <= mounts
    if render.which == "default":
        assert toml["data_dirs"] == ["/var/lib/sluice/data0", "/var/lib/sluice/data1"]
        # Every coordinator pod by its stable name.
        assert toml["coordinators"] == [
            f"sluice-coordinator-{i}.sluice-coordinator.sluice.svc:9096" for i in range(2)
        ]
    else:
        assert len(toml["data_dirs"]) == 3
        assert toml["coordinators"] == FULL_VALUES_DOC["server"]["config"]["coordinators"]
        assert toml["memory_budget_bytes"] == 17179869184
        assert toml["transport"]["zero_copy"] is False


def test_coordinator_toml(render):
    toml = tomllib.loads(render.config("coordinator.toml"))
    ports = {p["name"]: p["containerPort"] for p in render.container(render.coordinator)["ports"]}
    assert toml["listen"] == f"0.0.0.0:{ports['sluice']}"
    assert type(toml["server_timeout_ms"]) is int
    assert "secret" not in toml["transport"]


def test_coordinator_list_follows_replicas(template):
    result = template("--set", "coordinator.replicas=3", "--show-only", "templates/configmap.yaml")
    assert result.returncode == 0, result.stderr
    toml = tomllib.loads(yaml.safe_load(result.stdout)["data"]["server.toml"])
    assert [c.split(".")[0] for c in toml["coordinators"]] == [f"sluice-coordinator-{i}" for i in range(3)]


def test_toml_strings_are_escaped(template):
    tricky = 'quote " backslash \\ <tag> & tab\t'
    result = template(
        "--set-json",
        f"server.config.note={json.dumps(tricky)}",
        "--set-json",
        "server.config.flush_watermark=1",
        "--show-only",
        "templates/configmap.yaml",
    )
    assert result.returncode == 0, result.stderr
    toml = tomllib.loads(yaml.safe_load(result.stdout)["data"]["server.toml"])
    assert toml["note"] == tricky
    assert toml["flush_watermark"] == 1


def test_no_data_deleted_at_start(render):
    """Neither init containers nor commands that empty the data directories."""
    for sts in render.maybe("StatefulSet"):
        pod = sts["spec"]["template"]["spec"]
        assert "initContainers" not in pod
        for container in pod["containers"]:
            words = " ".join(container.get("command", []) + container.get("args", []))
            assert not re.search(r"\brm\b|-delete|\bfind\b", words), words


def test_drain_on_stop(render):
    container = render.container(render.server)
    toml = tomllib.loads(render.config("server.toml"))
    metrics_port = {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    drain_s = toml["drain_timeout_ms"] // 1000
    hook = ["/bin/bash", "/etc/sluice/config/drain.sh", str(metrics_port), str(drain_s)]
    if render.which == "full":
        # TLS: the hook talks HTTPS, checking the certificate with the Secret's CA.
        hook += ["/etc/sluice/tls/ca.crt", "sluice.example.internal"]
    assert command == hook
    assert {"name": "config", "mountPath": "/etc/sluice/config", "readOnly": True} in container["volumeMounts"]
    assert render.config("drain.sh") == (CHART_SOURCE / "files/drain.sh").read_text()
    assert f"--metrics-listen=0.0.0.0:{metrics_port}" in container["args"]
    # The grace period covers the whole drain, then the shutdown grace, with a margin.
    grace = render.pod(render.server)["terminationGracePeriodSeconds"]
    assert grace == drain_s + toml["transport"]["shutdown_grace_ms"] // 1000 + 15
    assert grace == (3645 if render.which == "default" else 1845)


def test_no_drain_no_hook(template):
    result = template("--set", "server.drain.enabled=false", "--show-only", "templates/server.yaml")
    assert result.returncode == 0, result.stderr
    sts = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "StatefulSet"][0]
    pod = sts["spec"]["template"]["spec"]
    assert "lifecycle" not in pod["containers"][0]
    assert pod["terminationGracePeriodSeconds"] == 45


def test_coordinator_grace_rounds_up(full):
    # shutdown_grace_ms 20500 in values-full.yaml: 21 s + 15.
    assert full.pod(full.coordinator)["terminationGracePeriodSeconds"] == 36


def test_probes_on_admin_api(render):
    # values-full.yaml turns TLS on: the metrics ports serve HTTPS, and the probes say so.
    scheme = {"scheme": "HTTPS"} if render.which == "full" else {}
    for component in ("coordinator", "server"):
        container = render.container(getattr(render, component))
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", **scheme}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics", **scheme}


def test_pod_hardening_and_service_links(render):
    for component in ("coordinator", "server"):
        pod = render.pod(getattr(render, component))
        # SLUICE_* variables are config keys: Service link variables must not reach the process.
        assert pod["enableServiceLinks"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        container = render.container(getattr(render, component))
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_server_identity_from_pod(default):
    env = default.env(default.server)
    assert env["SLUICE_SERVER_SERVER_ID"]["value"] == "$(POD_NAME)"
    assert env["SLUICE_SERVER_ADVERTISE_HOST"]["value"] == "$(POD_NAME).sluice-server.$(POD_NAMESPACE).svc"
    # Defined before use: Kubernetes expands $(VAR) only from earlier entries.
    order = [e["name"] for e in default.container(default.server)["env"]]
    assert order.index("POD_NAME") < order.index("SLUICE_SERVER_SERVER_ID")


def test_disruption_budgets(default, full):
    assert default.get("PodDisruptionBudget", default.server)["spec"]["maxUnavailable"] == 1
    assert default.get("PodDisruptionBudget", default.coordinator)["spec"]["minAvailable"] == 1
    assert full.get("PodDisruptionBudget", full.coordinator)["spec"]["minAvailable"] == 2


def test_single_coordinator_has_no_budget(template):
    # minAvailable 1 of 1 would block every node drain.
    result = template("--set", "coordinator.replicas=1")
    assert result.returncode == 0, result.stderr
    budgets = [d["metadata"]["name"] for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "PodDisruptionBudget"]
    assert budgets == ["sluice-server"]


def test_anti_affinity(default, full):
    for component in ("coordinator", "server"):
        soft = default.pod(getattr(default, component))["affinity"]["podAntiAffinity"]
        (term,) = soft["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        hard = full.pod(getattr(full, component))["affinity"]
        assert "requiredDuringSchedulingIgnoredDuringExecution" in hard["podAntiAffinity"]
        # The user's own affinity terms are kept beside it.
        assert "nodeAffinity" in hard


def test_storage_switch(default, full):
    sts = default.get("StatefulSet", default.server)
    claims = [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]]
    assert claims == ["data-0", "data-1"]
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    sts = full.get("StatefulSet", full.server)
    assert "volumeClaimTemplates" not in sts["spec"]
    paths = [v["hostPath"]["path"] for v in sts["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]
    assert paths == FULL_VALUES_DOC["server"]["persistence"]["hostPath"]["paths"]


def test_generated_secrets(default):
    for key in ("admin-token", "transport-secret"):
        value = default.secret_value("sluice-secrets", key)
        # Read from the environment as TOML first: it must never parse as a number or boolean.
        assert re.fullmatch(r"sluice-[A-Za-z0-9]{40}", value), value
    server = default.env(default.server)
    ref = server["SLUICE_SERVER_TRANSPORT__SECRET"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "sluice-secrets", "key": "transport-secret"}
    assert server["SLUICE_SERVER_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "admin-token"
    coordinator = default.env(default.coordinator)
    assert coordinator["SLUICE_COORDINATOR_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "sluice-secrets"
    # Coordinators take the same cluster key: servers prove it to them (docs/security.md).
    ref = coordinator["SLUICE_COORDINATOR_TRANSPORT__SECRET"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "sluice-secrets", "key": "transport-secret"}


def test_existing_secrets(full):
    server = full.env(full.server)
    assert server["SLUICE_SERVER_TRANSPORT__SECRET"]["valueFrom"]["secretKeyRef"] == {"name": "sluice-secret", "key": "secret"}
    assert server["SLUICE_SERVER_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "sluice-admin", "key": "token"}


def test_secrets_off(template):
    result = template("--set", "adminToken.enabled=false", "--set", "transportSecret.enabled=false")
    assert result.returncode == 0, result.stderr
    render = parse(result.stdout)
    assert not render.maybe("Secret")
    assert not [n for n in render.env(render.server) if "TOKEN" in n or "SECRET" in n]


def test_tls_mounted(full):
    for component in ("coordinator", "server"):
        mounts = full.container(getattr(full, component))["volumeMounts"]
        assert {"name": "tls", "mountPath": "/etc/sluice/tls", "readOnly": True} in mounts
        volumes = full.pod(getattr(full, component))["volumes"]
        assert {"name": "tls", "secret": {"secretName": "sluice-tls"}} in volumes


def test_tls_off_by_default(default):
    for name in ("server.toml", "coordinator.toml"):
        toml = tomllib.loads(default.config(name))
        assert "tls" not in toml.get("transport", {}), name
        assert not {"coordinator_tls", "peer_tls"} & toml.keys(), name
    for component in ("coordinator", "server"):
        assert "tls" not in [m["name"] for m in default.container(getattr(default, component))["volumeMounts"]]


def test_tls_wired_into_both_components(full):
    mount = "/etc/sluice/tls"
    listen = {
        "cert_file": f"{mount}/tls.crt",
        "key_file": f"{mount}/tls.key",
        "client_ca_file": f"{mount}/ca.crt",  # tls.mutual
        "ktls": False,
    }
    # Servers and coordinators present tls.crt to coordinators (mTLS) and check them by serverName.
    dial = {
        "ca_file": f"{mount}/ca.crt",
        "server_name": "sluice.example.internal",
        "cert_file": f"{mount}/tls.crt",
        "key_file": f"{mount}/tls.key",
    }
    server = tomllib.loads(full.config("server.toml"))
    assert server["transport"]["tls"] == listen
    assert server["coordinator_tls"] == dial
    # The user's own transport keys stay beside the chart's tls table.
    assert server["transport"]["max_connections"] == 8192
    coordinator = tomllib.loads(full.config("coordinator.toml"))
    assert coordinator["transport"]["tls"] == listen
    assert coordinator["peer_tls"] == dial
    assert coordinator["transport"]["max_connections"] == 1024


def test_tls_default_server_name_and_no_mtls(template):
    result = template("--set", "tls.enabled=true", "--set", "tls.secretName=certs",
                      "--set", "metrics.serviceMonitor.enabled=true")
    assert result.returncode == 0, result.stderr
    r = parse(result.stdout)
    server = tomllib.loads(r.config("server.toml"))
    assert server["transport"]["tls"] == {
        "cert_file": "/etc/sluice/tls/tls.crt", "key_file": "/etc/sluice/tls/tls.key", "ktls": True}
    assert server["coordinator_tls"] == {"ca_file": "/etc/sluice/tls/ca.crt", "server_name": "sluice.sluice.svc"}
    assert r.container(r.server)["lifecycle"]["preStop"]["exec"]["command"][-2:] == [
        "/etc/sluice/tls/ca.crt", "sluice.sluice.svc"]
    (monitor,) = r.maybe("ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["tlsConfig"]["serverName"] == "sluice.sluice.svc"


def test_service_monitor_scrapes_https_with_tls(full, template):
    (monitor,) = full.maybe("ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "sluice-tls", "key": "ca.crt"}},
        "serverName": "sluice.example.internal",
    }
    result = template("--set", "metrics.serviceMonitor.enabled=true")
    assert result.returncode == 0, result.stderr
    (plain,) = parse(result.stdout).maybe("ServiceMonitor")
    assert "scheme" not in plain["spec"]["endpoints"][0]
    assert "tlsConfig" not in plain["spec"]["endpoints"][0]


def test_service_monitor_selects_both_services(full):
    (monitor,) = full.maybe("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [s for s in full.maybe("Service") if selector.items() <= s["metadata"]["labels"].items()]
    assert sorted(s["metadata"]["name"] for s in services) == [full.coordinator, full.server]
    (endpoint,) = monitor["spec"]["endpoints"]
    for service in services:
        assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["publishNotReadyAddresses"] is True


def test_dashboard_configmap(full):
    cm = full.get("ConfigMap", "shuffle-dashboard")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Sluice"}
    assert json.loads(cm["data"]["sluice.json"]) == json.loads((ROOT / "deploy/grafana/sluice.json").read_text())


def test_config_change_rolls_only_its_component(template, default):
    result = template("--set", "coordinator.config.server_timeout_ms=20000")
    assert result.returncode == 0, result.stderr
    changed = parse(result.stdout)

    def checksum(render, name):
        return render.get("StatefulSet", name)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum(changed, default.coordinator) != checksum(default, default.coordinator)
    assert checksum(changed, default.server) == checksum(default, default.server)


REFUSED = [
    (
        ["--set", "server.persistence.type=hostPath"],
        "server.persistence.type=hostPath needs server.podAntiAffinity=hard",
    ),
    (["--set", "server.config.listen=0.0.0.0:1"], "server.config.listen is set by the chart"),
    (["--set", "server.config.data_dirs={/x}"], "server.config.data_dirs is set by the chart"),
    (["--set", "server.config.server_id=a"], "server.config.server_id is set by the chart"),
    (["--set", "coordinator.config.listen=0.0.0.0:1"], "coordinator.config.listen is set by the chart"),
    (["--set", "server.config.transport.secret=x"], "use transportSecret"),
    (["--set", "tls.enabled=true"], "tls.secretName is required"),
    (
        ["--set", "tls.enabled=true", "--set", "tls.secretName=s", "--set", "server.config.transport.tls.ktls=false"],
        "server.config.transport.tls is set by the chart from the tls values",
    ),
    (
        ["--set", "tls.enabled=true", "--set", "tls.secretName=s", "--set", "server.config.coordinator_tls.ca_file=x"],
        "server.config.coordinator_tls is set by the chart",
    ),
    (["--set", "server.podAntiAffinity=sometimes"], "podAntiAffinity"),
    (["--set", "server.persistance.type=hostPath"], "persistance"),
    (["--set", "coordinator.replicas=0"], "replicas"),
    (
        ["--set", "adminToken.secretKey=same", "--set", "transportSecret.secretKey=same"],
        "both same: the two values must differ",
    ),
    (["--set-json", 'server.config.transport.weird={"a":[{"b":1}]}'], "cannot write"),
]


@pytest.mark.parametrize("args,message", REFUSED, ids=[m for _, m in REFUSED])
def test_refused_values(template, args, message):
    result = template(*args)
    assert result.returncode != 0, f"helm template {' '.join(args)} rendered"
    assert message in result.stderr, result.stderr


def test_runtime_image_has_bash():
    """The preStop hook runs /bin/bash (the image has no curl): Debian's slim images ship it."""
    dockerfile = (ROOT / "deploy/docker/Dockerfile").read_text()
    runtime = re.findall(r"^FROM (\S+) AS runtime", dockerfile, re.M)
    assert runtime == ["debian:${DEBIAN_RELEASE}-slim"], runtime

