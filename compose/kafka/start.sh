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
# The passwords never reach a command line, which ps shows to everyone on
# the host: the storage tool runs from a java argument file (java @FILE),
# made readable by this user only and removed once it ran, rather than
# through kafka-storage.sh, whose arguments follow the main class and so
# would have to be on the command line.
#
#   CLUSTER_ID    the KRaft cluster id (required)
#   SCRAM_USERS   the users, space separated (required)
#   KAFKA_HOME    Apache Kafka's distribution. Default /opt/kafka (the image's)
#   SECRETS_DIR   where the secrets are. Default /run/secrets
#   JAVA_HOME     the JRE kafka-run-class.sh would use; default: java on PATH
set -eu
: "${CLUSTER_ID:?the KRaft cluster id}" "${SCRAM_USERS:?the SCRAM users}"
kafka=${KAFKA_HOME:-/opt/kafka}
secrets=${SECRETS_DIR:-/run/secrets}
config=$(dirname "$0")/server.properties
java=java
[ -n "${JAVA_HOME:-}" ] && java=$JAVA_HOME/bin/java

# One argument a line, quoted; a backslash or a double quote in a password
# is escaped, as the java launcher reads them.
quote() { printf '"%s"\n' "$(printf '%s' "$1" | sed 's/[\\"]/\\&/g')"; }
args=$(umask 077 && mktemp)
trap 'rm -f "$args"' EXIT
{
	for a in kafka.tools.StorageTool format --ignore-formatted --cluster-id "$CLUSTER_ID" --config "$config"; do
		quote "$a"
	done
	for user in $SCRAM_USERS; do
		quote --add-scram
		quote "SCRAM-SHA-512=[name=$user,password=$(cat "$secrets/kafka_$user")]"
	done
} >"$args"
"$java" -cp "$kafka/libs/*" -Dlog4j2.configurationFile="$kafka/config/tools-log4j2.yaml" @"$args"
rm -f "$args"
trap - EXIT
exec "$kafka/bin/kafka-server-start.sh" "$config"
