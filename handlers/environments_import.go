package handlers

import (
	"context"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/environment"
	"berth/jobs"
)

// OCI image imports: an instance admin names an image in a registry; the import_image job pulls
// and flattens it into the environment's next image version (jobs/import_image.go). Files on the
// server (OCI layouts, docker save tarballs) are imported with `berth image import` instead: a
// request never names a host path.

// imageImportInput is the body of POST /api/environments/{id}/image-imports.
type imageImportInput struct {
	Source   string `json:"source"`
	Activate bool   `json:"activate"`
}

// validImageReference reports what is wrong with a registry reference, or "" when it is one.
func validImageReference(s string) string {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return "required: an image reference such as registry.example:5000/team/app:1.2"
	case len(s) > 512 || strings.ContainsAny(s, " \t\r\n\x00"):
		return "must be one image reference, without spaces"
	case strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") || strings.Contains(s, "://"):
		return "must be a registry reference (host/repository:tag or @sha256:…), not a path or URL; import files with berth image import"
	}
	if _, err := name.ParseReference(s); err != nil {
		return "not an image reference: " + err.Error()
	}
	return ""
}

// errImportUnavailable is the 503 of a server without a job client.
var errImportUnavailable = &httpError{Status: http.StatusServiceUnavailable, Code: "jobs_unavailable",
	Message: "This server cannot queue image imports."}

// errNoImages refuses an import into an environment whose driver has no image versions.
func errNoImages(driver string) error {
	return &httpError{Status: http.StatusConflict, Code: "no_image_versions",
		Message: "A " + driver + " environment has no image versions; sandbox and plugin environments do."}
}

// requestImageImport enqueues the import with its audit event, in one transaction.
func (s *Server) requestImageImport(ctx context.Context, r *http.Request, a access, id string, in imageImportInput) error {
	if err := s.requireAdmin(r, a, "image_version.import", "environment", id); err != nil {
		return err
	}
	if msg := validImageReference(in.Source); msg != "" {
		return invalid(map[string]string{"source": msg})
	}
	if s.jobs == nil {
		return errImportUnavailable
	}
	return db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		env, err := db.LockEnvironment(ctx, tx, a.Company.ID, id)
		if err != nil {
			return err
		}
		if env.Driver != environment.DriverSandbox && env.Driver != environment.DriverPlugin {
			return errNoImages(env.Driver)
		}
		args := jobs.ImportImageArgs{CompanyID: env.CompanyID, EnvironmentID: env.ID, Source: strings.TrimSpace(in.Source),
			Activate: in.Activate, UserID: a.P.User.ID, ActorLabel: a.P.User.Email}
		if _, err := jobs.Enqueue(ctx, s.jobs, tx, args); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "image_version.import_requested", "environment", env.ID,
			map[string]any{"source": args.Source, "activate": in.Activate})
	})
}

// apiImportImage is POST /api/environments/{id}/image-imports (instance admins): 202
// {status:"queued", source, activate}; the version appears in the image versions once imported.
func (s *Server) apiImportImage(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.adminObject(r, p, "environments", id, "image_version.import", "environment")
	if err != nil {
		return err
	}
	var in imageImportInput
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	if err := s.requestImageImport(r.Context(), r, a, id, in); err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"status": "queued", "source": strings.TrimSpace(in.Source), "activate": in.Activate})
	return nil
}

// importImageForm is the environment page's "Import image" form (fields source, activate).
func (s *Server) importImageForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.adminObject(r, p, "environments", id, "image_version.import", "environment")
	if err != nil {
		return err
	}
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	in := imageImportInput{Source: form.Get("source"), Activate: form.Get("activate") == "on"}
	if err := s.requestImageImport(r.Context(), r, a, id, in); err != nil {
		return err
	}
	redirectAfterForm(w, r, "/environments/"+id)
	return nil
}
