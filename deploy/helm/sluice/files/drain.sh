#!/bin/bash
# preStop hook of the server pods: `bash drain.sh PORT DRAIN_SECONDS [CA_FILE SERVER_NAME]`.
#
# Asks the server to drain through its admin HTTP API on its metrics port (POST /api/v1/drain,
# with the admin token when SLUICE_SERVER_ADMIN_TOKEN is set), checks that it is draining
# (GET /readyz answers 503), then waits until every shuffle it holds is committed (GET
# /api/v1/status says "uncommitted_shuffles": 0: committed shuffles are durable, and the
# restarted server serves them again), until it has exited by itself, or for DRAIN_SECONDS at
# most. Kubernetes sends SIGTERM when this hook returns; the server (which would wait for the
# same on SIGTERM alone) then stops within transport.shutdown_grace_ms;
# terminationGracePeriodSeconds covers both. Bash's /dev/tcp
# speaks the HTTP: the image has no curl. With CA_FILE (the server runs TLS, its metrics port
# serves HTTPS) the requests go through `sluice admin request` instead, which checks the server's
# certificate against CA_FILE and SERVER_NAME (`sluice` must be on the PATH, as in the image). If
# the drain cannot start the hook exits non-zero at once, and SIGTERM stops the server without a
# drain.
set -u
port=${1:?usage: drain.sh METRICS_PORT DRAIN_SECONDS [CA_FILE SERVER_NAME]}
drain_seconds=${2:?usage: drain.sh METRICS_PORT DRAIN_SECONDS [CA_FILE SERVER_NAME]}
ca_file=${3:-}
server_name=${4:-}

auth=""
if [ -n "${SLUICE_SERVER_ADMIN_TOKEN:-}" ]; then
  auth="Authorization: Bearer ${SLUICE_SERVER_ADMIN_TOKEN}"$'\r\n'
fi

# https METHOD PATH: as `http`, through `sluice admin request` (the token from the environment).
https() {
  local out
  code="" body=""
  out=$(env ${SLUICE_SERVER_ADMIN_TOKEN:+SLUICE_ADMIN_TOKEN="$SLUICE_SERVER_ADMIN_TOKEN"} \
    sluice admin --request-timeout-secs 10 \
    --tls-ca-file "$ca_file" ${server_name:+--tls-server-name "$server_name"} \
    request --server "127.0.0.1:${port}" "$1" "$2") || return 1
  code=${out%%$'\n'*}
  [[ $out == *$'\n'* ]] && body=${out#*$'\n'}
  return 0
}

# http METHOD PATH: sets `code` (empty if no answer came) and `body`.
http() {
  local line
  if [ -n "$ca_file" ]; then
    https "$@"
    return
  fi
  code="" body=""
  exec 3<>"/dev/tcp/127.0.0.1/${port}" || return 1
  printf '%s %s HTTP/1.1\r\nHost: 127.0.0.1:%s\r\n%sContent-Length: 0\r\nConnection: close\r\n\r\n' \
    "$1" "$2" "$port" "$auth" >&3
  if IFS=' ' read -r -t 10 _ code _ <&3; then
    code=${code%$'\r'} # a status line without a reason phrase ends at the code
    while IFS= read -r -t 10 line && [ "$line" != $'\r' ]; do :; done <&3
    while IFS= read -r -t 10 line || [ -n "$line" ]; do body+=$line; done <&3
  fi
  exec 3>&-
}

http POST /api/v1/drain 2>/dev/null
case "$code" in
  2??) ;;
  *)
    echo "drain: POST /api/v1/drain on 127.0.0.1:${port} answered '${code:-nothing}'" >&2
    exit 1
    ;;
esac
# A server that did not start draining would keep this hook waiting for nothing.
http GET /readyz 2>/dev/null
if [ "$code" != 503 ]; then
  echo "drain: GET /readyz answered '${code:-nothing}' after the drain request, not 503" >&2
  exit 1
fi
echo "drain: draining for at most ${drain_seconds} s" >&2
deadline=$((SECONDS + drain_seconds))
while [ "$SECONDS" -lt "$deadline" ]; do
  if ! http GET /api/v1/status 2>/dev/null || [ -z "$code" ]; then
    echo "drain: the server has stopped" >&2
    exit 0
  fi
  if [[ $body =~ \"uncommitted_shuffles\":[[:space:]]*0[,}[:space:]] ]]; then
    echo "drain: no uncommitted shuffle left" >&2
    exit 0
  fi
  sleep 2
done
echo "drain: ${drain_seconds} s are up; stopping with uncommitted shuffles" >&2
