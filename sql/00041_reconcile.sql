-- Reconciliation (issue #17, docs/operations.md#reconcile): the corrections
-- `onceflow reconcile` made, one per stuck thing it found.
--
-- A row is written in the transaction that makes the correction (a
-- command into the outbox, and for a resent outbox_dead row its removal
-- from outbox_dead), under the primary key (kind, subject): two
-- reconcilers running at once correct a finding once, and a finding that
-- was corrected is not found again (its original command may stay pending
-- or failed in command_status: reconciliation corrects through commands,
-- never by editing a read model). The same correction is also written to
-- audit_log, where operators read what happened to an aggregate.
--
-- kind     pending, outbox-dead, dlq, inbound or job;
-- subject  what was stuck: a command id, an outbox id, a DLQ record
--          (topic/partition:offset), a provider event (provider/event id),
--          a River job id;
-- action   resend (the same command again, its command id unchanged) or
--          command (a correcting command, command_id, chosen by the
--          authority); a job's resend is River's retry of the job, and
--          command_id is then the command whose event made the job.

-- +goose Up
CREATE TABLE reconcile_corrections (
    kind         text        NOT NULL,
    subject      text        NOT NULL,
    action       text        NOT NULL CHECK (action IN ('resend', 'command')),
    tenant       text        NOT NULL,
    aggregate_id text        NOT NULL,
    command_id   uuid        NOT NULL,   -- the command sent (a job: its event's command)
    key          text,                   -- the idempotency key or provider event the authority was asked about
    reason       text        NOT NULL,   -- the authority's word
    corrected_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, subject)
);

-- +goose Down
DROP TABLE reconcile_corrections;
