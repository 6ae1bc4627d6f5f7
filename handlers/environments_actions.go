package handlers

import (
	"net/http"

	"berth/db"
)

// Environment page actions: create, edit, archive and unarchive from the pages, through the same
// core functions as the API.

// createEnvironmentForm creates an environment from the list page's form: 303 to its page
// (htmx: HX-Redirect); refusals show the form again with the messages.
func (s *Server) createEnvironmentForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	if err := s.requireAdmin(r, a, "environment.create", "environment", ""); err != nil {
		return err
	}
	f, err := readEnvironmentForm(w, r)
	if err != nil {
		return err
	}
	form := newEnvironmentForm(a.Company.ID, f.Driver)
	in, fields := f.input()
	if len(fields) > 0 {
		return s.renderEnvironments(w, r, a, http.StatusUnprocessableEntity, f.refill(form, fields))
	}
	env, err := s.createEnvironment(ctx, r, a, in)
	if he, ok := formRefusal(err); ok {
		return s.renderEnvironments(w, r, a, he.Status, f.refill(form, f.formFields(formErrors(he))))
	}
	if err != nil {
		return err
	}
	redirectAfterForm(w, r, "/environments/"+env.ID)
	return nil
}

// updateEnvironmentForm saves the edit form: an empty private key and secret lines with a name
// only keep the stored values. Success shows the page again (htmx swaps it in; a plain browser
// is redirected to it).
func (s *Server) updateEnvironmentForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.adminObject(r, p, "environments", id, "environment.update", "environment")
	if err != nil {
		return err
	}
	f, err := readEnvironmentForm(w, r)
	if err != nil {
		return err
	}
	in, fields := f.input()
	status := http.StatusUnprocessableEntity
	if len(fields) == 0 {
		_, err = s.updateEnvironment(ctx, r, a, id, in)
		he, refused := formRefusal(err)
		if !refused {
			return s.afterEnvironmentAction(w, r, a, id, err)
		}
		fields, status = f.formFields(formErrors(he)), he.Status
	}
	env, err := db.EnvironmentByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	d, err := s.environmentView(ctx, a, env, f.Driver)
	if err != nil {
		return err
	}
	d.Edit = f.refill(d.Edit, fields)
	return s.renderEnvironment(w, r, a, status, d)
}

// archiveEnvironmentForm archives an environment from its page; a live lease shows the reason.
func (s *Server) archiveEnvironmentForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	return s.environmentStatusForm(w, r, p, db.EnvironmentArchived)
}

// unarchiveEnvironmentForm restores an archived environment from its page.
func (s *Server) unarchiveEnvironmentForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	return s.environmentStatusForm(w, r, p, db.EnvironmentActive)
}

// environmentStatusForm sets an environment's status from a page form.
func (s *Server) environmentStatusForm(w http.ResponseWriter, r *http.Request, p *principal, status string) error {
	ctx := r.Context()
	id := r.PathValue("id")
	a, err := s.objectAccess(ctx, p, "environments", id)
	if err != nil {
		return err
	}
	_, err = s.updateEnvironment(ctx, r, a, id, environmentInput{Status: &status})
	return s.afterEnvironmentAction(w, r, a, id, err)
}

// afterEnvironmentAction answers a page form that changed an environment. Success: htmx gets the
// fresh page to swap in, a plain browser a 303 to it. A refusal (409: a live lease) shows the
// page with the reason and its status; other errors go to the adapter.
func (s *Server) afterEnvironmentAction(w http.ResponseWriter, r *http.Request, a access, id string, err error) error {
	he, refused := formRefusal(err)
	if err != nil && !refused {
		return err
	}
	if err == nil && !isHTMX(r) {
		redirectAfterForm(w, r, "/environments/"+id)
		return nil
	}
	env, loadErr := db.EnvironmentByID(r.Context(), s.pool, a.Company.ID, id)
	if loadErr != nil {
		return loadErr
	}
	d, loadErr := s.environmentView(r.Context(), a, env, "")
	if loadErr != nil {
		return loadErr
	}
	status := http.StatusOK
	if refused {
		status, d.Alert = he.Status, refusalMessage(he)
	}
	return s.renderEnvironment(w, r, a, status, d)
}
