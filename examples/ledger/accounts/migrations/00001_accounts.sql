-- accounts is the ledger's balance read model. version is the aggregate
-- version of the last event applied; updates are guarded by it.
--
-- IF NOT EXISTS: databases migrated before the ledger had migrations of
-- its own got this table from onceflow's first migration.

-- +goose Up
CREATE TABLE IF NOT EXISTS accounts (
    tenant     text        NOT NULL,
    account_id text        NOT NULL,
    currency   text        NOT NULL,
    balance    bigint      NOT NULL DEFAULT 0,
    status     text        NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')),
    version    bigint      NOT NULL,
    updated_at timestamptz NOT NULL,           -- time of the last event applied
    PRIMARY KEY (tenant, account_id)
);

-- +goose Down
DROP TABLE accounts;
