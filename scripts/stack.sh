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
# The demo tenant's API key is written into .data/stack/api-key.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="$PWD/compose/local/containers.conf"
project=onceflow-stack
state=.data/stack
mkdir -p "$state"
log=$state/compose.log
export ONCEFLOW_HTTP_PORT=${STACK_HTTP_PORT:-38080}
export ONCEFLOW_PROMETHEUS_PORT=${STACK_PROMETHEUS_PORT:-39090}
components="ingest relay processor projector worker lag"

# podman-compose 1.0 cannot read a service's network settings (nginx's
# fixed address, ipv4_address, which it takes for a network's name): it
# reads a copy of docker-compose.yml without them, beside it so that the
# paths in it mean the same (git ignores it).
podman_file() {
  sed '/^    networks:$/{N;s/^    networks:\n      default: {ipv4_address: [0-9.]*}$/    networks: [default]/;}' \
    compose/docker-compose.yml >compose/.podman-compose.yml
  if grep -q ipv4_address compose/.podman-compose.yml; then
    echo "stack: compose/docker-compose.yml gives a service an address in a form scripts/stack.sh does not rewrite" >&2
    return 1
  fi
}

# podman-compose prints the merged file, .env's values among them: its
# output goes to a log of this user's only.
pc() {
  (umask 077 && podman-compose -p "$project" -f compose/.podman-compose.yml -f compose/docker-compose.local.yml "$@" >>"$log" 2>&1) ||
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

# containers SERVICE...: the containers of the services (every replica).
containers() {
  for svc in "$@"; do
    podman ps -a --filter "label=io.podman.compose.project=$project" --filter "label=com.docker.compose.service=$svc" --format '{{.Names}}'
  done
}

up() {
  local t0=$SECONDS
  if [ -n "$(podman ps -q --filter "name=^${project}_lb_1\$")" ]; then
    echo "stack: already up (make stack-down first to start it afresh)"
    return 0
  fi
  [ -d compose/secrets ] || compose/secrets.sh
  podman_file
  # podman-compose 1.0 starts every dependency of a service it is told to
  # start, again, whatever its state (a one-shot service would run twice):
  # it only creates the containers, the network and the volumes here, and
  # the script starts them. The schema registry and Grafana, dependencies
  # it cannot create (their images are not built here), fail at once.
  pc up --no-start kafka postgres kafka-acls migrate $components lb prometheus
  podman start $(containers kafka postgres) >/dev/null
  healthy ${project}_kafka_1
  healthy ${project}_postgres_1
  echo "stack: kafka, postgres healthy: $((SECONDS - t0))s"
  podman start ${project}_kafka-acls_1 >/dev/null
  completed ${project}_kafka-acls_1
  podman start ${project}_migrate_1 >/dev/null
  completed ${project}_migrate_1
  # The demo tenant's key, which migrate's `onceflow tenants create demo`
  # prints once.
  (umask 077 && podman logs ${project}_migrate_1 2>&1 | sed -n 's/^api key //p' >"$state/api-key")
  [ -s "$state/api-key" ] || { echo "stack: migrate printed no API key" >&2; return 1; }
  echo "stack: ACLs, migrations, topics, demo tenant: $((SECONDS - t0))s"
  # shellcheck disable=SC2046 # one name per container
  podman start $(containers $components lb prometheus) >/dev/null
  local url=http://127.0.0.1:$ONCEFLOW_HTTP_PORT
  for _ in $(seq 1 90); do
    case $(curl -s -o /dev/null -w '%{http_code}' "$url/v1/accounts/none" -H "Authorization: Bearer $(cat "$state/api-key")") in
      000 | 502 | 503 | 504) sleep 2 ;;
      *)
        echo "stack: up in $((SECONDS - t0))s: API $url (the demo tenant's key: $state/api-key), Prometheus http://127.0.0.1:$ONCEFLOW_PROMETHEUS_PORT"
        return 0
        ;;
    esac
  done
  echo "stack: $url does not answer; podman-compose's log: $log" >&2
  return 1
}

down() {
  podman_file
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
  rm -f compose/.podman-compose.yml
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
