-- Index entries, written in the transaction of the event that sets them. Compared by bytes (`C`),
-- so listings come in the order SQLite's and the virtual store's do.
CREATE TABLE {s}.index_entries (
    name     text COLLATE "C" NOT NULL,
    key      text COLLATE "C" NOT NULL,
    value    text COLLATE "C" NOT NULL,
    run_id   text   NOT NULL,
    sequence bigint NOT NULL,
    PRIMARY KEY (name, key)
);
CREATE INDEX index_entries_by_value ON {s}.index_entries (name, value, key);
