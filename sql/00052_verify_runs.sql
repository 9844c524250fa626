-- verify_runs: the result of each `onceflow verify` (docs/operations.md#verify),
-- one row per run, written by the command when it ends. verify is a
-- one-shot command an operator (or a CronJob) runs; every admin server's
-- status page reads the newest row and exports it
-- (onceflow_verify_last_run_timestamp_seconds, onceflow_verify_findings,
-- onceflow_verify_last_run_ok), so the result of the last run is seen where
-- the pipeline's other figures are, whichever process is scraped. findings
-- counts the run's findings by stage and kind ({"projector": {"lost": 1}});
-- the ids themselves are in the command's output, not here (the status
-- page shows no ids). Rows older than 90 days are deleted by the run that
-- writes a new one.

-- +goose Up
CREATE TABLE verify_runs (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    window_from timestamptz NOT NULL,
    window_to   timestamptz NOT NULL,
    tenant      text        NOT NULL DEFAULT '',
    ok          boolean     NOT NULL,
    findings    jsonb       NOT NULL,
    not_checked int         NOT NULL,
    db_user     text        NOT NULL DEFAULT session_user
);
CREATE INDEX verify_runs_finished_at ON verify_runs (finished_at);

-- +goose Down
DROP TABLE verify_runs;
