#!/bin/sh
# Runs once, when the data directory is made: the roles of
# docs/security.md#database-roles. onceflow_owner owns the database and
# migrates it; onceflow_app serves, as a member of onceflow_runtime (the
# migrations grant that role what the components need, and nothing more).
#
# The passwords never reach a command line, which ps shows to everyone on
# the host: psql reads each from its secret's file itself (\set with a
# backquoted cat, whose command line holds only the file's name).
#
#   POSTGRES_USER  the superuser (the image's)
#   SECRETS_DIR    where the secrets are. Default /run/secrets
set -eu
secrets=${SECRETS_DIR:-/run/secrets}
case "$secrets" in *[!A-Za-z0-9_./-]*) echo "init.sh: SECRETS_DIR $secrets: want a plain path" >&2; exit 1;; esac
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres <<SQL
\set owner_pw \`cat $secrets/pg_owner\`
\set app_pw \`cat $secrets/pg_app\`
CREATE ROLE onceflow_owner LOGIN PASSWORD :'owner_pw';
CREATE ROLE onceflow_runtime NOLOGIN;
CREATE ROLE onceflow_app LOGIN PASSWORD :'app_pw' IN ROLE onceflow_runtime;
CREATE DATABASE onceflow OWNER onceflow_owner;
REVOKE CONNECT, TEMPORARY ON DATABASE onceflow FROM PUBLIC;
GRANT CONNECT ON DATABASE onceflow TO onceflow_owner, onceflow_app;
SQL
