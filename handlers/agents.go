package handlers

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/views"
)

// agentInput is the body of POST …/agents and the create-agent form.
type agentInput struct {
	Name        string `json:"name"`
	Description string `json:"description"`
}

// normalized trims what people type around names and descriptions.
func (in agentInput) normalized() agentInput {
	return agentInput{Name: strings.TrimSpace(in.Name), Description: strings.TrimSpace(in.Description)}
}

// validate applies the agents table's rules, one message per field.
func (in agentInput) validate() map[string]string {
	fields := map[string]string{}
	switch n := utf8.RuneCountInString(in.Name); {
	case n == 0:
		fields["name"] = "Enter a name."
	case n > 100:
		fields["name"] = "Use at most 100 characters."
	default:
		if msg := textProblem(in.Name); msg != "" {
			fields["name"] = "The name " + msg + "."
		}
	}
	if utf8.RuneCountInString(in.Description) > 2000 {
		fields["description"] = "Use at most 2000 characters."
	} else if msg := descriptionProblem(in.Description); msg != "" {
		fields["description"] = "The description " + msg + "."
	}
	return fields
}

// agentJSON is an agent in API responses.
type agentJSON struct {
	ID          string    `json:"id"`
	CompanyID   string    `json:"company_id"`
	Name        string    `json:"name"`
	Description string    `json:"description"`
	Disabled    bool      `json:"disabled"`
	CreatedAt   time.Time `json:"created_at"`
}

// agentResponse shapes an agent for the API.
func agentResponse(ag db.Agent) agentJSON {
	return agentJSON{ID: ag.ID, CompanyID: ag.CompanyID, Name: ag.Name, Description: ag.Description,
		Disabled: ag.Disabled(), CreatedAt: ag.CreatedAt.UTC()}
}

// createAgent creates an agent; a name already used in the company is a 409 agent_name_taken.
// The caller has passed requireManage.
func (s *Server) createAgent(ctx context.Context, r *http.Request, a access, in agentInput) (db.Agent, error) {
	in = in.normalized()
	if fields := in.validate(); len(fields) > 0 {
		return db.Agent{}, invalid(fields)
	}
	var ag db.Agent
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if ag, err = db.CreateAgent(ctx, tx, a.Company.ID, in.Name, in.Description, a.P.User.ID); err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "agent.created", "agent", ag.ID, map[string]any{"name": ag.Name})
	})
	if errors.Is(err, db.ErrConflict) {
		return db.Agent{}, &httpError{Status: http.StatusConflict, Code: "agent_name_taken",
			Message: "This company already has an agent with that name.",
			Fields:  map[string]string{"name": "An agent with this name exists; choose another."}}
	}
	if err != nil {
		return db.Agent{}, err
	}
	return ag, nil
}

// disableAgent disables an agent and revokes its tokens. Disabling a disabled agent changes
// nothing and records nothing. The caller has passed requireManage for the agent's company.
func (s *Server) disableAgent(ctx context.Context, r *http.Request, a access, id string) (db.Agent, error) {
	var ag db.Agent
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		var (
			changed bool
			err     error
		)
		if ag, changed, err = db.DisableAgent(ctx, tx, a.Company.ID, id); err != nil || !changed {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "agent.disabled", "agent", ag.ID, map[string]any{"name": ag.Name})
	})
	return ag, err
}

// agentCursor is the keyset position of an agents list: the last name of a page.
type agentCursor struct {
	Name string `json:"n"`
}

// agentList is the company's agents, in name order, for the API and the agents page.
func (s *Server) agentList(a access) keysetList[db.Agent, agentCursor] {
	return keysetList[db.Agent, agentCursor]{
		fetch: func(ctx context.Context, after agentCursor, limit int) ([]db.Agent, error) {
			return db.ListAgents(ctx, s.pool, a.Company.ID, after.Name, limit)
		},
		key: func(ag db.Agent) agentCursor { return agentCursor{Name: ag.Name} },
	}
}

// apiListAgents is GET /api/companies/{cid}/agents: any member or instance admin.
func (s *Server) apiListAgents(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	return serveKeyset(w, r, s.agentList(a), agentResponse)
}

// apiCreateAgent is POST /api/companies/{cid}/agents {name, description}: board members; 201.
func (s *Server) apiCreateAgent(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.managedCompany(r, p, "agent.create", "agent", "")
	if err != nil {
		return err
	}
	var in agentInput
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	ag, err := s.createAgent(r.Context(), r, a, in)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, agentResponse(ag))
	return nil
}

// apiDisableAgent is POST /api/agents/{id}/disable (no body, or {}): board members of the
// agent's company; idempotent, 200 with the agent.
func (s *Server) apiDisableAgent(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.manageObject(r, p, "agents", id, "agent.disable", "agent")
	if err != nil {
		return err
	}
	if err := emptyJSONBody(w, r); err != nil {
		return err
	}
	ag, err := s.disableAgent(r.Context(), r, a, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, agentResponse(ag))
	return nil
}

// agentsPageLimit is how many agents one page of the agents page lists.
const agentsPageLimit = 100

// agentsData loads what the agents page shows for the caller.
func (s *Server) agentsData(ctx context.Context, a access, cursor string) (views.AgentsData, error) {
	as, next, err := s.agentList(a).page(ctx, cursor, agentsPageLimit)
	if err != nil {
		return views.AgentsData{}, err
	}
	d := views.AgentsData{CompanyID: a.Company.ID, CanManage: a.canManage()}
	for _, ag := range as {
		d.Agents = append(d.Agents, views.AgentRow{ID: ag.ID, Name: ag.Name, Description: ag.Description,
			Disabled: ag.Disabled(), CreatedAt: ag.CreatedAt})
	}
	if next != "" {
		d.NextURL = "/companies/" + a.Company.ID + "/agents?cursor=" + url.QueryEscape(next)
	}
	return d, nil
}

// agentsPage is GET /companies/{cid}/agents: the list for any member or instance admin, with the
// create and disable forms for board members.
func (s *Server) agentsPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	d, err := s.agentsData(r.Context(), a, r.URL.Query().Get("cursor"))
	if err != nil {
		return err
	}
	return s.render(w, r, views.AgentsPage(s.companyFrame(r, a, "Agents", "agents"), d))
}

// createAgentForm is POST /companies/{cid}/agents (form name, description): board members.
func (s *Server) createAgentForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.managedCompany(r, p, "agent.create", "agent", "")
	if err != nil {
		return err
	}
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	in := agentInput{Name: form.Get("name"), Description: form.Get("description")}
	_, err = s.createAgent(r.Context(), r, a, in)
	return s.afterAgentChange(w, r, a, err, views.AgentForm{Name: in.Name, Description: in.Description})
}

// disableAgentForm is POST /companies/{cid}/agents/{id}/disable: board members; another
// company's agent is a 404.
func (s *Server) disableAgentForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.managedCompany(r, p, "agent.disable", "agent", id)
	if err != nil {
		return err
	}
	_, err = s.disableAgent(r.Context(), r, a, id)
	return s.afterAgentChange(w, r, a, err, views.AgentForm{})
}

// afterAgentChange answers an agents form: htmx gets the refreshed section, a plain form a
// redirect to the page; a refusal (422, 409) shows the create form again with its messages.
func (s *Server) afterAgentChange(w http.ResponseWriter, r *http.Request, a access, err error, form views.AgentForm) error {
	he, refused := formRefusal(err)
	if err != nil && !refused {
		return err
	}
	if !refused && !isHTMX(r) {
		http.Redirect(w, r, "/companies/"+a.Company.ID+"/agents", http.StatusSeeOther)
		return nil
	}
	d, err := s.agentsData(r.Context(), a, "")
	if err != nil {
		return err
	}
	status := http.StatusOK
	if refused {
		status = he.Status
		d.Form = form
		d.Form.Errors = he.Fields
	}
	if isHTMX(r) {
		return s.renderStatus(w, r, status, views.AgentsSection(d))
	}
	return s.renderStatus(w, r, status, views.AgentsPage(s.companyFrame(r, a, "Agents", "agents"), d))
}
