#!/bin/sh
# The local stand-in's entry point (compose/local/postgres.Containerfile):
# as root, it hands the data directory to postgres and runs again as
# postgres; then, on an empty data directory, initdb with the superuser
# POSTGRES_USER and the password of POSTGRES_PASSWORD_FILE, the scripts of
# /docker-entrypoint-initdb.d on a server reachable by its socket only,
# and finally the command (postgres and its settings).
set -eu
: "${PGDATA:=/var/lib/postgresql/data}" "${POSTGRES_USER:=postgres}"
if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA" /var/run/postgresql
	chown postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	: "${POSTGRES_PASSWORD_FILE:?the superuser's password file}"
	initdb -D "$PGDATA" --username="$POSTGRES_USER" --pwfile="$POSTGRES_PASSWORD_FILE" \
		--auth-local=trust --auth-host=scram-sha-256 >/dev/null
	# Every interface of the container, as the official image's; pg_hba.conf
	# says who may connect.
	echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
	pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" start >/dev/null
	for f in /docker-entrypoint-initdb.d/*.sh; do
		[ -e "$f" ] || continue
		echo "docker-entrypoint.sh: running $f"
		POSTGRES_USER=$POSTGRES_USER sh "$f"
	done
	pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
fi
exec "$@"
