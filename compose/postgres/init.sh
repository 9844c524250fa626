#!/bin/sh
# Runs once, when the data directory is made: the roles of
# docs/security.md#database-roles. onceflow_owner owns the database and
# migrates it; onceflow_app serves, as a member of onceflow_runtime (the
# migrations grant that role what the components need, and nothing more).
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v owner_pw="$(cat /run/secrets/pg_owner)" -v app_pw="$(cat /run/secrets/pg_app)" <<'SQL'
CREATE ROLE onceflow_owner LOGIN PASSWORD :'owner_pw';
CREATE ROLE onceflow_runtime NOLOGIN;
CREATE ROLE onceflow_app LOGIN PASSWORD :'app_pw' IN ROLE onceflow_runtime;
CREATE DATABASE onceflow OWNER onceflow_owner;
REVOKE CONNECT, TEMPORARY ON DATABASE onceflow FROM PUBLIC;
GRANT CONNECT ON DATABASE onceflow TO onceflow_owner, onceflow_app;
SQL
