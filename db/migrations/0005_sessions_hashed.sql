-- Browser sessions are stored under the sha256 (hex) of their token from now on (db.SessionStore),
-- so the database never holds a live session token. The rows written before this migration are
-- keyed by the plain token: they would never be found again under the new scheme, and they are
-- exactly the secrets this change removes, so they go. Everyone signs in once more. The table keeps
-- its shape: the token column now holds 64 hex characters.

DELETE FROM sessions;
