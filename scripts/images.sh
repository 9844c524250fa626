#!/usr/bin/env bash
# make images: the local stack's images, built from this repository,
# Debian's packages and Maven Central alone, with podman
# (docs/deploy.md#the-local-stack); nothing is pulled from an image
# registry.
#
#   localhost/onceflow-debian:bookworm   the base: debootstrap --variant=minbase
#                                        bookworm, imported (once; its tarball is
#                                        kept in .data/stack)
#   localhost/onceflow:dev               onceflow's binaries, built here (CGO_ENABLED=0)
#   localhost/onceflow-kafka:VERSION     Apache Kafka, make kafka-up's jars, on Debian's JRE
#   localhost/onceflow-postgres:15       Debian's postgresql-15
#   localhost/onceflow-prometheus:bookworm  Debian's prometheus
#   localhost/onceflow-nginx:bookworm    Debian's nginx
#
# The third-party stand-ins and the base are built only when missing
# (-f rebuilds them); onceflow's image is built every time, from the
# working tree.
#
#   DEBIAN_MIRROR   debootstrap's mirror. Default: the first Debian archive
#                   of /etc/apt/sources.list*, the one apt uses here
#   VERSION         onceflow's image version label. Default: git describe
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="$PWD/compose/local/containers.conf"
cache=.data/stack
mkdir -p "$cache"
force=false
[ "${1:-}" = "-f" ] && force=true

# step NAME COMMAND...: runs it and prints how long it took.
step() {
  local name=$1 t0=$SECONDS
  shift
  "$@"
  echo "images: $name: $((SECONDS - t0))s"
}
missing() { $force || ! podman image exists "$1"; }

mirror() {
  [ -n "${DEBIAN_MIRROR:-}" ] && { echo "$DEBIAN_MIRROR"; return; }
  # One-line (deb URL SUITE) or deb822 (URIs: URL) sources; the archive,
  # not the security one.
  # (cat fails on a file that is missing, sources.list on a deb822 host:
  # under pipefail that failure must not add the default to what it found.)
  local found
  found=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
    sed -n -e 's/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\) .*/\2/p' -e 's/^URIs: *\([^ ]*\).*/\1/p' |
    grep -v security | head -n 1 || true)
  echo "${found:-http://deb.debian.org/debian}"
}

base() {
  local tar=$cache/debian-bookworm.tar
  if [ ! -s "$tar" ] || $force; then
    local root=$cache/rootfs
    # Three tries: a mirror's answer lost once is not a broken build.
    local try
    for try in 1 2 3; do
      rm -rf "$root"
      debootstrap --variant=minbase bookworm "$root" "$(mirror)" >"$cache/debootstrap.log" 2>&1 && break
      [ "$try" = 3 ] && { tail -n 20 "$cache/debootstrap.log"; return 1; }
      echo "images: debootstrap failed (try $try of 3); again in 10s" >&2
      sleep 10
    done
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    # The images' own apt-get retries a download, for the same reason.
    echo 'Acquire::Retries "5";' >"$root/etc/apt/apt.conf.d/80onceflow-retries"
    tar -C "$root" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
    rm -rf "$root"
  fi
  podman import --quiet "$tar" localhost/onceflow-debian:bookworm >/dev/null
}

onceflow() {
  local ctx=$cache/onceflow old
  rm -rf "$ctx" && mkdir -p "$ctx/bin"
  CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$ctx/bin/" ./cmd/...
  old=$(podman image inspect --format '{{.Id}}' localhost/onceflow:dev 2>/dev/null || true)
  # --no-cache: buildah would take the label of a cached layer built with
  # another VERSION.
  podman build --quiet --no-cache -f compose/local/onceflow.Containerfile --build-arg VERSION="$version" \
    -t localhost/onceflow:dev "$ctx" >/dev/null
  rm -rf "$ctx"
  # The image the tag named before, untagged now: removed, unless a
  # container still runs it.
  if [ -n "$old" ] && [ "$old" != "$(podman image inspect --format '{{.Id}}' localhost/onceflow:dev)" ]; then
    podman rmi "$old" >/dev/null 2>&1 || true
  fi
}

# kafka_script NAME CLASS [JVM ARGUMENTS]: bin/NAME runs CLASS on the jars,
# as the distribution's kafka-run-class.sh does (KAFKA_HEAP_OPTS,
# KAFKA_OPTS).
kafka_script() {
  local name=$1 class=$2
  shift 2
  cat >"$ctx/bin/$name" <<SH
#!/bin/sh
# Apache Kafka $kafka_version's $name (scripts/images.sh).
exec java \${KAFKA_HEAP_OPTS:-$*} -Djava.awt.headless=true \\
  -Dlog4j2.configurationFile=\${KAFKA_LOG4J_CONFIG:-/opt/kafka/config/tools-log4j2.yaml} \\
  \${KAFKA_OPTS:-} -cp '/opt/kafka/libs/*' $class "\$@"
SH
  chmod 755 "$ctx/bin/$name"
}

log4j2() { # level
  cat <<YAML
Configuration:
  Appenders:
    Console:
      name: STDERR
      target: SYSTEM_ERR
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: $1
      AppenderRef:
        - ref: STDERR
YAML
}

kafka() {
  ctx=$cache/kafka
  rm -rf "$ctx" && mkdir -p "$ctx/bin" "$ctx/config"
  cp -r "$kafka_lib" "$ctx/libs"
  log4j2 WARN >"$ctx/config/tools-log4j2.yaml"
  log4j2 INFO >"$ctx/config/log4j2.yaml"
  cat >"$ctx/bin/kafka-server-start.sh" <<SH
#!/bin/sh
# Apache Kafka $kafka_version's broker (scripts/images.sh): kafka.Kafka with
# the distribution's JVM settings.
exec java \${KAFKA_HEAP_OPTS:--Xmx512m -Xms256m} -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \\
  -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \\
  -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.yaml -Dkafka.logs.dir=/tmp \\
  \${KAFKA_OPTS:-} -cp '/opt/kafka/libs/*' kafka.Kafka "\$@"
SH
  chmod 755 "$ctx/bin/kafka-server-start.sh"
  # A short-lived JVM: the first compiler tier starts it faster.
  kafka_script kafka-acls.sh org.apache.kafka.tools.AclCommand -XX:TieredStopAtLevel=1 -Xmx256m
  kafka_script kafka-broker-api-versions.sh org.apache.kafka.tools.BrokerApiVersionsCommand -XX:TieredStopAtLevel=1 -Xmx256m
  kafka_script kafka-topics.sh org.apache.kafka.tools.TopicCommand -XX:TieredStopAtLevel=1 -Xmx256m
  kafka_script kafka-storage.sh kafka.tools.StorageTool -XX:TieredStopAtLevel=1 -Xmx256m
  podman build --quiet -f compose/local/kafka.Containerfile --build-arg VERSION="$kafka_version" \
    -t "localhost/onceflow-kafka:$kafka_version" "$ctx" >/dev/null
  rm -rf "$ctx"
}

# third NAME: one of the stand-ins whose Containerfile needs only itself
# (and postgres its entry point).
third() {
  local name=$1 tag=$2 ctx=$cache/$1
  rm -rf "$ctx" && mkdir -p "$ctx"
  [ "$name" = postgres ] && cp compose/local/postgres-entrypoint.sh "$ctx/"
  podman build --quiet -f "compose/local/$name.Containerfile" -t "localhost/onceflow-$name:$tag" "$ctx" >/dev/null
  rm -rf "$ctx"
}

version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
missing localhost/onceflow-debian:bookworm && step "base (debootstrap, import)" base
step "onceflow:dev ($version)" onceflow
kafka_lib=$(go run ./test/kafkacluster/kafkactl fetch -cache .data/apache-kafka)
kafka_version=$(basename "$(dirname "$kafka_lib")")
kafka_version=${kafka_version%%-*}
missing "localhost/onceflow-kafka:$kafka_version" && step "onceflow-kafka:$kafka_version" kafka
missing localhost/onceflow-postgres:15 && step "onceflow-postgres:15" third postgres 15
missing localhost/onceflow-prometheus:bookworm && step "onceflow-prometheus:bookworm" third prometheus bookworm
missing localhost/onceflow-nginx:bookworm && step "onceflow-nginx:bookworm" third nginx bookworm
echo "images: ready (podman images --filter reference='localhost/onceflow*')"
