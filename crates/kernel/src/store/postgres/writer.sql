-- The statements a PostgreSQL world's writer prepares on each connection, each after a line
-- `-- name: <name>`. `{s}` is the world's schema. Every parameter is cast, so that its type is
-- the statement's own.

-- name: begin
BEGIN ISOLATION LEVEL READ COMMITTED

-- name: ensure_runs
INSERT INTO {s}.runs (run_id)
SELECT r FROM unnest($1::text[]) AS r ORDER BY r
ON CONFLICT (run_id) DO NOTHING

-- name: lock_runs
SELECT run_id, last_sequence, input_tokens, output_tokens, cached_tokens, reasoning_tokens
FROM {s}.runs WHERE run_id = ANY($1::text[]) ORDER BY run_id FOR UPDATE

-- name: keys
SELECT e.run_id, e.idempotency_key, e.sequence, e.request_digest, e.envelope
FROM {s}.events e JOIN unnest($1::text[], $2::text[]) AS k(run_id, key)
ON e.run_id = k.run_id AND e.idempotency_key = k.key

-- name: terminals
SELECT t.run_id, t.node_id, t.sequence FROM {s}.terminals t
JOIN unnest($1::text[], $2::text[]) AS k(run_id, node_id)
ON t.run_id = k.run_id AND t.node_id = k.node_id

-- name: estimates
SELECT run_id, model, open FROM {s}.estimates WHERE run_id = ANY($1::text[])

-- name: insert_events
INSERT INTO {s}.events (run_id, sequence, event_id, type, idempotency_key, request_digest, recorded_at, envelope)
SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[])

-- name: insert_terminals
INSERT INTO {s}.terminals (run_id, node_id, sequence, type)
SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[])

-- name: put_estimates
INSERT INTO {s}.estimates AS e (run_id, model, open)
SELECT * FROM unnest($1::text[], $2::text[], $3::int8[])
ON CONFLICT (run_id, model) DO UPDATE SET open = excluded.open

-- Rows are taken in id order, as `lock_runs` takes them, so that two writers never wait for each
-- other's rows the other way round. Every stream written already has its row; the insert is there
-- only to take the rows in that order. A group that started after another sequence than the one
-- stored (`written_after`) sets `last_sequence` to -1, which its check refuses.
-- name: put_runs
INSERT INTO {s}.runs AS r (run_id, last_sequence, first_recorded_at, last_recorded_at,
    input_tokens, output_tokens, cached_tokens, reasoning_tokens, status, written_after)
SELECT u.run_id, u.last, u.first, u.at, u.i, u.o, u.c, u.rt, u.st, u.after
FROM unnest($1::text[], $2::int8[], $3::text[], $4::int8[], $5::int8[], $6::int8[], $7::int8[],
    $8::text[], $9::int8[], $10::text[]) AS u(run_id, last, at, i, o, c, rt, st, after, first)
ORDER BY u.run_id
ON CONFLICT (run_id) DO UPDATE SET
    last_sequence = CASE WHEN r.last_sequence = excluded.written_after
        THEN excluded.last_sequence ELSE -1 END,
    written_after = excluded.written_after,
    first_recorded_at = coalesce(r.first_recorded_at, excluded.first_recorded_at),
    last_recorded_at = excluded.last_recorded_at,
    input_tokens = excluded.input_tokens,
    output_tokens = excluded.output_tokens,
    cached_tokens = excluded.cached_tokens,
    reasoning_tokens = excluded.reasoning_tokens,
    status = CASE WHEN excluded.status IS NULL THEN r.status
        WHEN excluded.status = '' THEN CASE WHEN r.status = 'pending' THEN 'running' ELSE r.status END
        ELSE excluded.status END

-- name: index_lock
SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))

-- name: index_holder
SELECT run_id FROM {s}.index_entries WHERE name = $1::text AND key = $2::text

-- name: put_index
INSERT INTO {s}.index_entries (name, key, value, run_id, sequence)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[])
ON CONFLICT (name, key) DO UPDATE SET
    value = excluded.value, run_id = excluded.run_id, sequence = excluded.sequence

-- name: drop_index
DELETE FROM {s}.index_entries AS i USING unnest($1::text[], $2::text[]) AS k(name, key)
WHERE i.name = k.name AND i.key = k.key

-- name: guard
SELECT pg_current_xact_id()::text

-- name: notify
SELECT pg_notify($1::text, $2::text)
