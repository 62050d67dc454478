#!/bin/sh
# First start on an empty volume: a cluster whose superuser is POSTGRES_USER with the password
# from the environment (never from the image), owning the database POSTGRES_DB, reachable with
# that password from the compose network. Later starts find the cluster and just run it.
set -eu
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
: "${POSTGRES_USER:=flexgate}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust \
    --auth-host=scram-sha-256 --encoding=UTF8 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  pg_ctl -w -o "-c listen_addresses=''" start >/dev/null
  # A database named after the user would be the default; create it only when it differs.
  if [ "$POSTGRES_DB" != postgres ]; then
    createdb --username="$POSTGRES_USER" --owner="$POSTGRES_USER" "$POSTGRES_DB"
  fi
  pg_ctl -w -m fast stop >/dev/null
  echo "flexgate-postgres: initialised $PGDATA for $POSTGRES_USER/$POSTGRES_DB"
fi
exec postgres -c listen_addresses='*'
