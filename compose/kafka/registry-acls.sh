#!/bin/sh
# The schema registry's Kafka ACLs, beside onceflow's
# (scripts/kafka-acls.sh): it keeps the schemas in the topic _schemas,
# which it creates, reads and writes, and elects its leader in the group
# schema-registry; its store's reader has a group of its own,
# schema-registry-HOST-PORT. Same variables as scripts/kafka-acls.sh.
set -eu
: "${BOOTSTRAP:?the brokers}" "${COMMAND_CONFIG:?the admin client properties}"
REGISTRY=${REGISTRY:-User:registry}

acls() {
	"${KAFKA_ACLS:-kafka-acls.sh}" --bootstrap-server "$BOOTSTRAP" --command-config "$COMMAND_CONFIG" --add --force "$@"
}

acls --allow-principal "$REGISTRY" --operation Create --operation Describe --operation DescribeConfigs \
	--operation Read --operation Write --topic _schemas
acls --allow-principal "$REGISTRY" --operation Read --resource-pattern-type prefixed --group schema-registry
