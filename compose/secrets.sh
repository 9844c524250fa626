#!/usr/bin/env bash
# Makes what the compose stack authenticates with, once, into
# compose/secrets/ (ignored by git) and compose/.env: a password per
# account, a CA with server certificates for Postgres and the schema
# registry, and the files Kafka, the registry and Postgres read them from
# (docs/security.md#the-compose-stack). Run it before the first
# `docker compose up`; run it again with -f to replace everything (then
# drop the pgdata volume: Postgres keeps its first passwords).
set -euo pipefail
cd "$(dirname "$0")"
dir=secrets
if [ -e "$dir" ] && [ "${1:-}" != "-f" ]; then
  echo "$dir exists; $0 -f replaces it" >&2
  exit 1
fi
rm -rf "$dir" && mkdir -m 700 "$dir"
umask 077
pw() { openssl rand -hex 24; }
for name in pg_superuser pg_owner pg_app kafka_admin kafka_onceflow kafka_registry registry_onceflow grafana_admin admin_token; do
  pw > "$dir/$name"
done
r() { cat "$dir/$1"; }

# Postgres: the owner migrates, the runtime role serves
# (docs/security.md#database-roles); libpq's password files.
echo "postgres:5432:onceflow:onceflow_owner:$(r pg_owner)" > "$dir/pgpass_owner"
echo "postgres:5432:onceflow:onceflow_app:$(r pg_app)" > "$dir/pgpass_app"

# A CA of the stack's own and the servers' certificates.
openssl req -x509 -newkey rsa:3072 -nodes -days 825 -subj "/CN=onceflow compose CA" \
  -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
cert() { # name, subjectAltName
  openssl req -newkey rsa:3072 -nodes -subj "/CN=$1" -keyout "$dir/$1.key" -out "$dir/$1.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 825 \
    -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth' "$2") -out "$dir/$1.crt" 2>/dev/null
  rm "$dir/$1.csr"
}
cert postgres DNS:postgres,DNS:localhost
cert schema-registry DNS:schema-registry,DNS:localhost
keystore_pw=$(pw)
openssl pkcs12 -export -in "$dir/schema-registry.crt" -inkey "$dir/schema-registry.key" \
  -passout "pass:$keystore_pw" -out "$dir/schema-registry.p12"

# Kafka: SASL PLAIN users (the broker's JAAS file), and the admin's client
# settings for the broker's own health check.
cat > "$dir/kafka_jaas.conf" <<JAAS
KafkaServer {
  org.apache.kafka.common.security.plain.PlainLoginModule required
  username="admin" password="$(r kafka_admin)"
  user_admin="$(r kafka_admin)"
  user_onceflow="$(r kafka_onceflow)"
  user_registry="$(r kafka_registry)";
};
JAAS
cat > "$dir/kafka_admin.properties" <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$(r kafka_admin)";
PROPS

# The schema registry: basic auth users (Jetty's property file) and its
# own Kafka login.
echo "onceflow: $(r registry_onceflow),onceflow" > "$dir/registry_users.properties"
cat > "$dir/registry_jaas.conf" <<JAAS
SchemaRegistry {
  org.eclipse.jetty.jaas.spi.PropertyFileLoginModule required
  file="/run/secrets/registry_users"
  debug="false";
};
KafkaClient {
  org.apache.kafka.common.security.plain.PlainLoginModule required
  username="registry" password="$(r kafka_registry)";
};
JAAS

# Interpolated into docker-compose.yml: the registry's keystore password
# (the keystore itself is a secret) and its Kafka login, which its image
# reads only from the environment.
cat > .env <<ENV
ONCEFLOW_REGISTRY_KEYSTORE_PASSWORD=$keystore_pw
ONCEFLOW_REGISTRY_KAFKA_JAAS=org.apache.kafka.common.security.plain.PlainLoginModule required username="registry" password="$(r kafka_registry)";
ENV
chmod 600 .env
# The containers run as users of their own: let them read their secrets.
chmod 644 "$dir"/*
chmod 600 "$dir/ca.key"
echo "made compose/$dir/ and compose/.env (keep both out of version control)"
