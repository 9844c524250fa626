#!/bin/sh
# Starts the compose stack's Kafka node on server.properties beside this
# script. Its storage is formatted the first time, as the local cluster's
# is (test/kafkacluster): Apache Kafka 4's defaults, so transaction.version
# 2 (KIP-890), with the SCRAM-SHA-512 users of SCRAM_USERS created in it
# (kafka-storage format --add-scram), each with the password in the
# secret kafka_USER. KRaft has no other way to its first users: a user can
# only be added over the listeners by one that authenticates. Formatted
# storage is kept (the kafkadata volume) with its users.
#
#   CLUSTER_ID    the KRaft cluster id (required)
#   SCRAM_USERS   the users, space separated (required)
#   KAFKA_HOME    Apache Kafka's distribution. Default /opt/kafka (the image's)
#   SECRETS_DIR   where the secrets are. Default /run/secrets
set -eu
: "${CLUSTER_ID:?the KRaft cluster id}" "${SCRAM_USERS:?the SCRAM users}"
kafka=${KAFKA_HOME:-/opt/kafka}
secrets=${SECRETS_DIR:-/run/secrets}
config=$(dirname "$0")/server.properties
set --
for user in $SCRAM_USERS; do
	set -- "$@" --add-scram "SCRAM-SHA-512=[name=$user,password=$(cat "$secrets/kafka_$user")]"
done
"$kafka/bin/kafka-storage.sh" format --ignore-formatted --cluster-id "$CLUSTER_ID" --config "$config" "$@"
exec "$kafka/bin/kafka-server-start.sh" "$config"
