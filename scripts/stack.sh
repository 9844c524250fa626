#!/usr/bin/env bash
# make stack-up / make stack-down: the compose stack (compose/
# docker-compose.yml with compose/docker-compose.local.yml's images, which
# scripts/images.sh builds) started with podman-compose, in order, as
# docker compose's health conditions would (podman has no systemd here, so
# its health checks run only when asked: this script asks them).
#
#   scripts/stack.sh up     secrets (compose/secrets.sh, once), Kafka and
#                           Postgres healthy, the ACLs granted, the migrations,
#                           topics and demo tenant made, then every component,
#                           nginx and Prometheus; prints the addresses
#   scripts/stack.sh down   removes the containers, the network and the volumes
#
# Published on 127.0.0.1 only:
#   STACK_HTTP_PORT         nginx in front of ingest. Default 38080
#   STACK_PROMETHEUS_PORT   Prometheus. Default 39090
# The demo tenant's API key is made once into .data/stack/api-key.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="$PWD/compose/local/containers.conf"
project=onceflow-stack
state=.data/stack
mkdir -p "$state"
log=$state/compose.log
export ONCEFLOW_HTTP_PORT=${STACK_HTTP_PORT:-38080}
export ONCEFLOW_PROMETHEUS_PORT=${STACK_PROMETHEUS_PORT:-39090}

# podman-compose prints the merged file, .env's values among them: its
# output goes to a log of this user's only.
pc() {
  (umask 077 && podman-compose -p "$project" -f compose/docker-compose.yml -f compose/docker-compose.local.yml "$@" >>"$log" 2>&1) ||
    { echo "stack: podman-compose $*: failed (log: $log)" >&2; return 1; }
}

# healthy CONTAINER: its health check passes, asked every 2s for 3 minutes.
healthy() {
  for _ in $(seq 1 90); do
    podman healthcheck run "$1" >/dev/null 2>&1 && return 0
    [ "$(podman inspect -f '{{.State.Running}}' "$1")" = true ] || break
    sleep 2
  done
  echo "stack: $1 is not healthy; its log:" >&2
  podman logs --tail 30 "$1" >&2
  return 1
}

# completed CONTAINER: it exits 0.
completed() {
  local rc
  rc=$(podman wait "$1")
  if [ "$rc" != 0 ]; then
    echo "stack: $1 exited with $rc; its log:" >&2
    podman logs --tail 30 "$1" >&2
    return 1
  fi
}

up() {
  local t0=$SECONDS
  [ -d compose/secrets ] || compose/secrets.sh
  [ -s "$state/api-key" ] || (umask 077 && echo "of_stack_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$state/api-key")
  ONCEFLOW_DEV_API_KEY=$(cat "$state/api-key")
  export ONCEFLOW_DEV_API_KEY
  pc up -d --no-deps kafka postgres
  healthy ${project}_kafka_1
  healthy ${project}_postgres_1
  echo "stack: kafka, postgres healthy: $((SECONDS - t0))s"
  pc up -d --no-deps kafka-acls
  completed ${project}_kafka-acls_1
  pc up -d --no-deps migrate
  completed ${project}_migrate_1
  echo "stack: ACLs, migrations, topics, demo tenant: $((SECONDS - t0))s"
  pc up -d --no-deps ingest relay processor projector worker lag lb prometheus
  local url=http://127.0.0.1:$ONCEFLOW_HTTP_PORT
  for _ in $(seq 1 90); do
    case $(curl -s -o /dev/null -w '%{http_code}' "$url/v1/accounts/none" -H "Authorization: Bearer $ONCEFLOW_DEV_API_KEY") in
      000 | 502 | 503 | 504) sleep 2 ;;
      *)
        echo "stack: up in $((SECONDS - t0))s: API $url (demo tenant's key: $state/api-key), Prometheus http://127.0.0.1:$ONCEFLOW_PROMETHEUS_PORT"
        return 0
        ;;
    esac
  done
  echo "stack: $url does not answer; podman-compose's log: $log" >&2
  return 1
}

down() {
  pc down -v || true
  # What podman-compose 1.0 leaves: containers of a service it was not
  # told of, the network, volumes.
  local ids
  ids=$(podman ps -aq --filter "label=io.podman.compose.project=$project")
  [ -z "$ids" ] || podman rm -f $ids >/dev/null
  podman network exists ${project}_default && podman network rm -f ${project}_default >/dev/null
  for v in $(podman volume ls -q --filter "label=io.podman.compose.project=$project"); do
    podman volume rm -f "$v" >/dev/null
  done
  echo "stack: down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  *)
    echo "usage: $0 up|down" >&2
    exit 2
    ;;
esac
