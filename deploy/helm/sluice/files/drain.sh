#!/bin/bash
# preStop hook of the server pods: `bash drain.sh PORT`.
#
# Asks the server to drain through its admin HTTP API (POST /api/v1/drain on the metrics port,
# with the admin token when SLUICE_SERVER_ADMIN_TOKEN is set), checks that it is draining
# (GET /readyz answers 503), then waits while the port still accepts connections: a draining
# server stops by itself once it holds no shuffle, or after drain_timeout_ms. Kubernetes sends
# SIGTERM only when this hook returns, and terminationGracePeriodSeconds bounds both. Bash's
# /dev/tcp speaks the HTTP: the image has no curl. On any failure the hook exits non-zero at
# once, and SIGTERM then stops the server without a drain.
set -u
port=${1:?usage: drain.sh METRICS_PORT}

# http METHOD PATH [HEADER-LINE]: prints the response's status code (nothing if none came).
http() {
  local code=""
  exec 3<>"/dev/tcp/127.0.0.1/${port}" || return 1
  printf '%s %s HTTP/1.1\r\nHost: 127.0.0.1:%s\r\n%sContent-Length: 0\r\nConnection: close\r\n\r\n' \
    "$1" "$2" "$port" "${3:-}" >&3
  read -r -t 10 _ code _ <&3
  exec 3>&-
  echo "${code%$'\r'}" # a status line without a reason phrase ends at the code
}

auth=""
if [ -n "${SLUICE_SERVER_ADMIN_TOKEN:-}" ]; then
  auth="Authorization: Bearer ${SLUICE_SERVER_ADMIN_TOKEN}"$'\r\n'
fi
status=$(http POST /api/v1/drain "$auth")
case "$status" in
  2??) ;;
  *)
    echo "drain: POST /api/v1/drain on 127.0.0.1:${port} answered '${status:-nothing}'" >&2
    exit 1
    ;;
esac
# A server that did not start draining would keep this hook waiting for the whole grace period.
ready=$(http GET /readyz)
if [ "$ready" != 503 ]; then
  echo "drain: GET /readyz answered '${ready:-nothing}' after the drain request, not 503" >&2
  exit 1
fi
echo "drain: draining; waiting for the server to stop" >&2
while (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; do
  sleep 2
done
echo "drain: the server has stopped" >&2
