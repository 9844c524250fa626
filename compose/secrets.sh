#!/usr/bin/env bash
# Makes what the compose stack authenticates with, once, into
# compose/secrets/ (ignored by git) and compose/.env: a password per
# account (a Kafka user per component), a CA with certificates for Kafka,
# Postgres and the schema registry, and the files Kafka, the registry and
# Postgres read them from (docs/security.md#the-compose-stack). Run it
# before the first `docker compose up`; run it again with -f to replace
# everything (then drop the pgdata and kafkadata volumes: Postgres keeps
# its first passwords, Kafka the SCRAM users of its first start).
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
# The Kafka users are the broker's SCRAM_USERS (docker-compose.yml): the
# broker, an admin, the schema registry's, and one per onceflow principal
# (docs/security.md#kafka-acls).
for name in pg_superuser pg_owner pg_app registry_onceflow grafana_admin admin_token \
  kafka_admin kafka_broker kafka_registry kafka_ingest kafka_relay kafka_processor kafka_projector kafka_operator kafka_lag; do
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
cert() { # name, subjectAltName, extendedKeyUsage (default serverAuth)
  openssl req -newkey rsa:3072 -nodes -subj "/CN=$1" -keyout "$dir/$1.key" -out "$dir/$1.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial -days 825 \
    -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=%s' "$2" "${3:-serverAuth}") -out "$dir/$1.crt" 2>/dev/null
  rm "$dir/$1.csr"
}
cert postgres DNS:postgres,DNS:localhost
cert schema-registry DNS:schema-registry,DNS:localhost
# The Kafka node's: its clients' listeners (kafka:9092 on the stack's
# network, localhost:29092 from the host) and, as a client certificate,
# its controller listener, where only a holder of it may speak: its
# common name is the super user User:kafka-node (ssl.principal.mapping.rules
# in kafka/server.properties).
cert kafka-node DNS:kafka,DNS:localhost serverAuth,clientAuth
# Kafka reads its key and chain as one PEM file (ssl.keystore.type=PEM;
# an unencrypted PKCS#8 key needs no ssl.key.password).
cat "$dir/kafka-node.key" "$dir/kafka-node.crt" "$dir/ca.crt" > "$dir/kafka-node.pem"
rm "$dir/kafka-node.key" "$dir/kafka-node.crt"
keystore_pw=$(pw)
openssl pkcs12 -export -in "$dir/schema-registry.crt" -inkey "$dir/schema-registry.key" \
  -passout "pass:$keystore_pw" -out "$dir/schema-registry.p12"

# Kafka: SCRAM-SHA-512 over TLS (kafka/server.properties). The users are
# created with the broker's storage (kafka/start.sh: kafka-storage format
# --add-scram, from the kafka_USER files); the broker's JAAS file is its
# own login as the user broker, between brokers; admin's client settings
# serve the health check and the ACLs' init service.
scram() { # user
  echo "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"$1\" password=\"$(r "kafka_$1")\";"
}
cat > "$dir/kafka_jaas.conf" <<JAAS
KafkaServer {
  $(scram broker)
};
JAAS
cat > "$dir/kafka_admin.properties" <<PROPS
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=$(scram admin)
ssl.truststore.type=PEM
ssl.truststore.location=/run/secrets/ca_crt
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
  $(scram registry)
};
JAAS

# Interpolated into docker-compose.yml: the registry's keystore password
# (the keystore itself is a secret) and its Kafka login, which its image
# reads only from the environment.
cat > .env <<ENV
ONCEFLOW_REGISTRY_KEYSTORE_PASSWORD=$keystore_pw
ONCEFLOW_REGISTRY_KAFKA_JAAS=$(scram registry)
ENV
chmod 600 .env
# The containers run as users of their own: let them read their secrets.
chmod 644 "$dir"/*
chmod 600 "$dir/ca.key"
echo "made compose/$dir/ and compose/.env (keep both out of version control)"
