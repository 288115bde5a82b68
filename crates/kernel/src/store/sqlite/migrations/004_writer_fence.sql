-- Only writers of this schema append (see `store/sqlite/schema.rs`). An earlier version's
-- process has no such function, so its insert fails to prepare and stores nothing. Writers of
-- this schema built before `fence_writer` turned triggers off registered the function (true for
-- 4) and run the trigger: a later version replaces it with its own number, and they get the
-- message.
CREATE TRIGGER events_writer BEFORE INSERT ON events
 WHEN NOT little_world_writer(4)
 BEGIN
    SELECT RAISE(ABORT, 'this world was upgraded by a newer version of @little-workflow/world: append with that version');
 END;
