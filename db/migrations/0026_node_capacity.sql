-- How many runs a working node executes at once (its --max-workers; 0 for a node that does not
-- work jobs). A provision taken from the shared queue hands its run to a node with a smaller
-- share of its capacity in use (db.LighterNode, docs/scaling.md "Placement").
ALTER TABLE nodes ADD COLUMN capacity integer NOT NULL DEFAULT 0 CHECK (capacity >= 0);
