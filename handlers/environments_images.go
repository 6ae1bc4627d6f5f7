package handlers

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"berth/db"
	"berth/views"
)

// Image versions of sandbox environments: the JSON list and what the environment's page shows.

// imageVersionJSON is an image version as the API returns it.
type imageVersionJSON struct {
	Number    int       `json:"number"`
	Status    string    `json:"status"`
	Digest    *string   `json:"digest"`
	Size      int64     `json:"size"`
	CreatedAt time.Time `json:"created_at"`
	SessionID *string   `json:"session_id"`
}

func imageVersionOut(v db.ImageVersion) imageVersionJSON {
	return imageVersionJSON{Number: v.Number, Status: v.Status, Digest: optional(v.Digest), Size: v.Size,
		CreatedAt: v.CreatedAt.UTC(), SessionID: optional(v.CreatedBySession)}
}

// imageVersionPage reads one page of an environment's versions, newest first, from the request's
// limit and cursor, and the cursor of the next page ("" on the last).
func (s *Server) imageVersionPage(ctx context.Context, r *http.Request, a access, envID string) ([]db.ImageVersion, string, error) {
	limit, cursor, err := pageParams(r)
	if err != nil {
		return nil, "", err
	}
	var after db.ImageVersionCursor
	if err := decodeCursor(cursor, &after); err != nil {
		return nil, "", err
	}
	if after.Number < 0 {
		return nil, "", badRequest("bad_cursor", "The cursor is not valid; start again without it.")
	}
	list, err := db.ImageVersions(ctx, s.pool, a.Company.ID, envID, after, limit+1)
	if err != nil {
		return nil, "", err
	}
	list, next := keysetPage(list, limit, func(v db.ImageVersion) any { return db.ImageVersionCursor{Number: v.Number} })
	return list, next, nil
}

// apiListImageVersions is GET /api/environments/{id}/image-versions (readers): the environment's
// image versions, newest first; environments of other drivers have none.
func (s *Server) apiListImageVersions(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "environments", id)
	if err != nil {
		return err
	}
	list, next, err := s.imageVersionPage(ctx, r, a, id)
	if err != nil {
		return err
	}
	out := listResponse[imageVersionJSON]{Items: make([]imageVersionJSON, 0, len(list)), NextCursor: next}
	for _, v := range list {
		out.Items = append(out.Items, imageVersionOut(v))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// envImageVersionsShown is how many versions the environment's page lists (the newest).
const envImageVersionsShown = 20

// envImageVersionsView is the page's image versions card: the newest versions and the active one.
func (s *Server) envImageVersionsView(ctx context.Context, companyID, envID string) (views.EnvironmentImages, error) {
	list, err := db.ImageVersions(ctx, s.pool, companyID, envID, db.ImageVersionCursor{}, envImageVersionsShown+1)
	if err != nil {
		return views.EnvironmentImages{}, err
	}
	d := views.EnvironmentImages{More: len(list) > envImageVersionsShown}
	if d.LiveSession, err = s.liveSetupSessionID(ctx, companyID, envID); err != nil {
		return views.EnvironmentImages{}, err
	}
	if d.More {
		list = list[:envImageVersionsShown]
	}
	for _, v := range list {
		d.Rows = append(d.Rows, views.EnvironmentImageRow{Number: v.Number, Status: v.Status, Digest: v.Digest,
			ShortDigest: shortDigest(v.Digest), Size: sizeText(v.Size), CreatedAt: v.CreatedAt})
	}
	active, err := db.ActiveImageVersion(ctx, s.pool, companyID, envID)
	switch {
	case errors.Is(err, db.ErrNotFound):
	case err != nil:
		return views.EnvironmentImages{}, err
	default:
		d.Active = "version " + strconv.Itoa(active.Number) + " (" + shortDigest(active.Digest) + ")"
	}
	return d, nil
}

// shortDigest is a digest's first 12 hex digits, enough to tell versions apart on a page.
func shortDigest(d string) string {
	hex, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hex) < 12 {
		return d
	}
	return "sha256:" + hex[:12]
}

// sizeText says a layer's size in bytes, KiB, MiB or GiB.
func sizeText(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, suffix := float64(n)/unit, "KiB"
	for _, s := range []string{"MiB", "GiB", "TiB"} {
		if v < unit {
			break
		}
		v, suffix = v/unit, s
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + suffix
}
