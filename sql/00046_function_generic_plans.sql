-- The relay's head read and the projector's inbox lookup plan their query
-- once per connection (docs/decisions/0035-hot-functions-pin-their-plans.md).
--
-- PL/pgSQL keeps a function's query planned, but at each call Postgres
-- chooses between that generic plan and one made for the call's values
-- (plan_cache_mode = auto), and for these two the plan made for the
-- values always looked cheaper: a head read names one shard, where a
-- generic plan counts on ten elements in an array; the lookup's plan for
-- its values prunes the inbox's daily partitions when it is made. So
-- every call planned its query again, which pg_stat_statements does not
-- show (it counts the calling statement's planning only). Measured
-- alone, one connection, a call: the head read of one shard 0.146-0.149
-- ms against 0.095-0.101 with the generic plan; the lookup of one id over
-- 39 partitions 0.284-0.304 ms against 0.106-0.110 (docs/benchmarks.md#relay-draining-a-1000000-row-backlog-and-the-latency-it-adds).
-- The generic plans are those the SET clauses already pin: the (shard,
-- xid, id) index in its order, and the partitions pruned when the
-- executor starts.

-- +goose Up
ALTER FUNCTION onceflow_outbox_heads(int[], int) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION onceflow_inbox_seen(text, uuid[], timestamptz) SET plan_cache_mode = force_generic_plan;

-- +goose Down
ALTER FUNCTION onceflow_outbox_heads(int[], int) RESET plan_cache_mode;
ALTER FUNCTION onceflow_inbox_seen(text, uuid[], timestamptz) RESET plan_cache_mode;
