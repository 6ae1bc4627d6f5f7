package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/workspace"
)

// projectInput is a new project, from the API or the form.
type projectInput struct {
	Name        string
	Key         string
	Description string
	Policy      projectPolicyInput
}

// projectPolicyInput is an execution policy as submitted: empty members take their defaults.
type projectPolicyInput struct {
	DefaultMode       string
	AllowTaskOverride bool
	EnvironmentID     string
	Strategy          string
	BranchTemplate    string
}

// projectChange is an update: only the members that are set change.
type projectChange struct {
	Name        *string
	Description *string
	Status      *string
	Policy      *projectPolicyInput
}

// unarchivesOrOnlyStatus reports whether a change is allowed on an archived project: it
// unarchives it (possibly with other changes), or it only restates a status.
func (ch projectChange) unarchivesOrOnlyStatus() bool {
	if ch.Status == nil {
		return false
	}
	return *ch.Status == db.ProjectActive || ch.Name == nil && ch.Description == nil && ch.Policy == nil
}

var projectKeyRE = regexp.MustCompile(`^[A-Z][A-Z0-9]{1,9}$`)

// projectNameProblem says what is wrong with a project name, or "".
func projectNameProblem(name string) string {
	switch {
	case name == "":
		return "is required"
	case utf8.RuneCountInString(name) > 200:
		return "must be at most 200 characters"
	}
	return textProblem(name)
}

// projectKeyProblem says what is wrong with a project key, or "".
func projectKeyProblem(key string) string {
	switch {
	case key == "":
		return "is required"
	case !projectKeyRE.MatchString(key):
		return "must be 2–10 capital letters or digits, starting with a letter (for example WEB or API2)"
	}
	return ""
}

// projectDescriptionProblem says what is wrong with a project description, or "".
func projectDescriptionProblem(d string) string {
	if utf8.RuneCountInString(d) > 10000 {
		return "must be at most 10000 characters"
	}
	return descriptionProblem(d)
}

// projectControlRune reports the characters refused in names.
func projectControlRune(r rune) bool { return r < 0x20 || r == 0x7f }

// normalize fills the policy's defaults.
func (p projectPolicyInput) normalize() db.ExecutionPolicy {
	out := db.ExecutionPolicy{DefaultMode: p.DefaultMode, AllowTaskOverride: p.AllowTaskOverride,
		EnvironmentID: strings.TrimSpace(p.EnvironmentID), Strategy: p.Strategy,
		BranchTemplate: strings.TrimSpace(p.BranchTemplate)}
	if out.DefaultMode == "" {
		out.DefaultMode = workspace.ModeShared
	}
	if out.Strategy == "" {
		out.Strategy = string(workspace.StrategyGitWorktree)
	}
	if out.BranchTemplate == "" {
		out.BranchTemplate = workspace.DefaultBranchTemplate
	}
	return out
}

// projectPolicyProblems validates a normalized policy's shape into fields (keyed
// execution_policy.<member>); the environment is checked against the database separately.
func projectPolicyProblems(p db.ExecutionPolicy, fields map[string]string) {
	if p.DefaultMode != workspace.ModeShared && p.DefaultMode != workspace.ModeIsolated {
		fields["execution_policy.default_mode"] = `must be "shared" or "isolated"`
	}
	if p.Strategy != string(workspace.StrategyGitWorktree) && p.Strategy != string(workspace.StrategyCopy) {
		fields["execution_policy.strategy"] = `must be "git_worktree" or "copy"`
	}
	if msg := workspace.ValidBranchTemplate(p.BranchTemplate); msg != "" {
		fields["execution_policy.branch_template"] = msg
	}
}

// checkPolicyEnvironment refuses a policy environment that is not one of the company's, in the
// same words whether it is missing or another company's, and stores the id in its canonical
// form. An archived environment is refused unless the policy already names it (current), so
// unrelated edits still pass.
func checkPolicyEnvironment(ctx context.Context, q db.Querier, companyID string, policy *db.ExecutionPolicy, current string, fields map[string]string) error {
	if policy.EnvironmentID == "" {
		return nil
	}
	env, err := db.PolicyEnvironmentByID(ctx, q, companyID, policy.EnvironmentID)
	switch {
	case errors.Is(err, db.ErrNotFound):
		fields["execution_policy.environment_id"] = "is not an environment of this company"
	case err != nil:
		return err
	case env.Status != "active" && env.ID != current:
		fields["execution_policy.environment_id"] = fmt.Sprintf("environment %q is archived; choose an active one", env.Name)
	default:
		policy.EnvironmentID = env.ID
	}
	return nil
}

// createProject validates a new project and inserts it with its audit event. A key already used
// in the company is a 409 (with the message on the key field, for forms).
func (s *Server) createProject(ctx context.Context, r *http.Request, a access, in projectInput) (db.Project, error) {
	in.Name, in.Key = strings.TrimSpace(in.Name), strings.TrimSpace(in.Key)
	policy := in.Policy.normalize()
	fields := map[string]string{}
	projectAddProblem(fields, "name", projectNameProblem(in.Name))
	projectAddProblem(fields, "key", projectKeyProblem(in.Key))
	projectAddProblem(fields, "description", projectDescriptionProblem(in.Description))
	projectPolicyProblems(policy, fields)
	if err := checkPolicyEnvironment(ctx, s.pool, a.Company.ID, &policy, "", fields); err != nil {
		return db.Project{}, err
	}
	if len(fields) > 0 {
		return db.Project{}, invalid(fields)
	}
	var p db.Project
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		p, err = db.CreateProject(ctx, tx, a.Company.ID, db.ProjectFields{Name: in.Name, Key: in.Key,
			Description: in.Description, Policy: policy})
		if errors.Is(err, db.ErrConflict) {
			return &httpError{Status: http.StatusConflict, Code: "key_taken",
				Message: fmt.Sprintf("Another project of this company already uses the key %s.", in.Key),
				Fields:  map[string]string{"key": "is already used by another project of this company"}}
		}
		if err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "project.created", "project", p.ID,
			map[string]any{"key": p.Key, "name": p.Name})
	})
	return p, err
}

// errProjectArchived refuses changes to an archived project and its workspaces.
var errProjectArchived = &httpError{Status: http.StatusConflict, Code: "project_archived",
	Message: "The project is archived; unarchive it before changing it or its workspaces."}

// updateProject applies a change to a project under its row lock. An archived project accepts
// nothing but being unarchived (which may come with other changes in the same request).
// Archiving and unarchiving are audited as such; other changes as project.updated with the
// names of the changed fields. A change that changes nothing writes nothing.
func (s *Server) updateProject(ctx context.Context, r *http.Request, a access, id string, ch projectChange) (db.Project, error) {
	var p db.Project
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := db.LockProject(ctx, tx, a.Company.ID, id)
		if err != nil {
			return err
		}
		if cur.Archived() && !ch.unarchivesOrOnlyStatus() {
			return errProjectArchived
		}
		next, fields, err := applyProjectChange(ctx, tx, cur, ch)
		if err != nil {
			return err
		}
		if len(fields) > 0 {
			return invalid(fields)
		}
		changed := projectChangedFields(cur, next)
		if len(changed) == 0 && cur.Status == next.Status {
			p = cur
			return nil
		}
		if p, err = db.UpdateProject(ctx, tx, a.Company.ID, id, next); err != nil {
			return err
		}
		return s.auditProjectUpdate(ctx, tx, r, a, cur, p, changed)
	})
	return p, err
}

// applyProjectChange merges a change into the current project and validates the result.
func applyProjectChange(ctx context.Context, q db.Querier, cur db.Project, ch projectChange) (db.ProjectFields, map[string]string, error) {
	next := db.ProjectFields{Name: cur.Name, Key: cur.Key, Description: cur.Description, Status: cur.Status, Policy: cur.Policy}
	fields := map[string]string{}
	if ch.Name != nil {
		next.Name = strings.TrimSpace(*ch.Name)
		projectAddProblem(fields, "name", projectNameProblem(next.Name))
	}
	if ch.Description != nil {
		next.Description = *ch.Description
		projectAddProblem(fields, "description", projectDescriptionProblem(next.Description))
	}
	if ch.Status != nil {
		next.Status = *ch.Status
		if next.Status != db.ProjectActive && next.Status != db.ProjectArchived {
			fields["status"] = `must be "active" or "archived"`
		}
	}
	if ch.Policy != nil {
		next.Policy = ch.Policy.normalize()
		projectPolicyProblems(next.Policy, fields)
		if err := checkPolicyEnvironment(ctx, q, cur.CompanyID, &next.Policy, cur.Policy.EnvironmentID, fields); err != nil {
			return next, nil, err
		}
	}
	return next, fields, nil
}

// projectChangedFields names the fields (other than status) that differ between a project and
// its next values.
func projectChangedFields(cur db.Project, next db.ProjectFields) []string {
	var changed []string
	if cur.Name != next.Name {
		changed = append(changed, "name")
	}
	if cur.Description != next.Description {
		changed = append(changed, "description")
	}
	if cur.Policy != next.Policy {
		changed = append(changed, "execution_policy")
	}
	return changed
}

// auditProjectUpdate records an update and, separately, an archive or unarchive.
func (s *Server) auditProjectUpdate(ctx context.Context, tx pgx.Tx, r *http.Request, a access, before, after db.Project, changed []string) error {
	if len(changed) > 0 {
		if err := s.auditTx(ctx, tx, r, a, "project.updated", "project", after.ID,
			map[string]any{"key": after.Key, "changed": changed}); err != nil {
			return err
		}
	}
	switch {
	case before.Status != after.Status && after.Archived():
		return s.auditTx(ctx, tx, r, a, "project.archived", "project", after.ID, map[string]any{"key": after.Key})
	case before.Status != after.Status:
		return s.auditTx(ctx, tx, r, a, "project.unarchived", "project", after.ID, map[string]any{"key": after.Key})
	}
	return nil
}

// projectAddProblem records msg for field when there is one.
func projectAddProblem(fields map[string]string, field, msg string) {
	if msg != "" {
		fields[field] = msg
	}
}
