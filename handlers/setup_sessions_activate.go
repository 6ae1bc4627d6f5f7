package handlers

import (
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"berth/db"
)

// apiActivateImageVersion is POST /api/environments/{id}/image-versions/{n}/activate (instance
// admins): 200 with the version, now active; the previous active version becomes available.
// Activating an earlier version is a rollback; a failed, building or unknown version → 409/404.
func (s *Server) apiActivateImageVersion(w http.ResponseWriter, r *http.Request, p *principal) error {
	if err := emptyJSONBody(w, r); err != nil {
		return err
	}
	v, err := s.activateImageVersion(r, p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, imageVersionOut(v))
	return nil
}

// activateImageVersionForm is the environment page's Activate button.
func (s *Server) activateImageVersionForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	if _, err := readForm(w, r, maxFormBody); err != nil {
		return err
	}
	if _, err := s.activateImageVersion(r, p); err != nil {
		return err
	}
	redirectAfterForm(w, r, "/environments/"+r.PathValue("id"))
	return nil
}

func (s *Server) activateImageVersion(r *http.Request, p *principal) (db.ImageVersion, error) {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.adminObject(r, p, "environments", id, "image_version.activate", "environment")
	if err != nil {
		return db.ImageVersion{}, err
	}
	n, err := strconv.Atoi(r.PathValue("n"))
	if err != nil || n < 1 {
		return db.ImageVersion{}, errNotFound
	}
	var cur db.ImageVersion
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := db.LockEnvironment(ctx, tx, a.Company.ID, id); err != nil {
			return err
		}
		prev, v, err := db.ActivateImageVersion(ctx, tx, a.Company.ID, id, n)
		if err != nil {
			return err
		}
		cur = v
		if prev.ID == v.ID {
			return nil // already active: nothing changed, nothing to record
		}
		action := "image_version.activated"
		if prev.Number > v.Number {
			action = "image_version.rolled_back"
		}
		return s.auditTx(ctx, tx, r, a, action, "environment", id,
			map[string]any{"version": v.Number, "previous_version": prev.Number, "digest": v.Digest})
	})
	return cur, err
}
