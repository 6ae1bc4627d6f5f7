package handlers

import (
	"net/http"

	"berth/db"
)

// routes is the whole route table. Pages need a session (else a redirect to /login); /api needs
// a session or a bearer token (else 401); health and static files are public.
func (s *Server) routes(jobsUI http.Handler) http.Handler {
	mux := http.NewServeMux()

	mux.Handle("GET /static/", http.StripPrefix("/static", s.assets.Handler()))
	// Browsers that ask before reading the page's <link rel="icon"> get the hashed icon.
	mux.Handle("GET /favicon.ico", http.RedirectHandler(s.assets.URL("favicon.svg"), http.StatusMovedPermanently))

	mux.Handle("GET /login", s.handle(s.loginPage))
	mux.Handle("POST /login", s.handle(s.login))
	mux.Handle("POST /logout", s.handle(s.logout))
	mux.Handle("GET /{$}", s.page(s.dashboard))

	// Search (the command palette) and a person's own settings (search.go, settings.go).
	mux.Handle("GET /search", s.page(s.searchPage))
	mux.Handle("GET /api/search", s.api(s.searchAPI))
	mux.Handle("GET /settings", s.page(s.settingsPage))
	mux.Handle("POST /settings/password", s.page(s.changePasswordForm))
	mux.Handle("POST /settings/tokens", s.page(s.createTokenForm))
	mux.Handle("POST /settings/tokens/{id}/revoke", s.page(s.revokeTokenForm))
	mux.Handle("POST /settings/sessions/sign-out-others", s.page(s.signOutOthersForm))
	mux.Handle("GET /help", s.page(s.helpIndex))
	mux.Handle("GET /help/{name}", s.page(s.helpPage))
	mux.Handle("GET /help/screenshots/{file}", s.page(s.helpImage))
	mux.Handle("GET /api/me/tokens", s.api(s.myTokensAPI))
	mux.Handle("POST /api/me/tokens", s.api(s.createMyTokenAPI))
	mux.Handle("POST /api/me/tokens/{id}/revoke", s.api(s.revokeMyTokenAPI))

	mux.Handle("GET /api/health", s.handle(s.health))
	mux.Handle("GET /api/me", s.api(s.me))
	// Prometheus metrics (instance admins or BERTH_METRICS_TOKEN; anyone else 404; metrics.go).
	mux.Handle("GET /metrics", s.handle(s.metricsEndpoint))
	// Live pages: Server-Sent Events of the caller's companies' changes (events_stream.go,
	// docs/live.md); a session or a user's API token, else 401.
	mux.Handle("GET /events", s.handle(s.eventsStream))

	// Companies (POST: instance admins).
	mux.Handle("POST /api/companies", s.api(s.apiCreateCompany))
	mux.Handle("GET /api/companies", s.api(s.apiListCompanies))
	mux.Handle("GET /api/companies/{cid}", s.api(s.apiGetCompany))
	mux.Handle("POST /companies", s.page(s.createCompanyForm))

	// Members (changes: board members).
	mux.Handle("GET /api/companies/{cid}/members", s.api(s.apiListMembers))
	mux.Handle("POST /api/companies/{cid}/members", s.api(s.apiAddMember))
	mux.Handle("PATCH /api/companies/{cid}/members/{user_id}", s.api(s.apiChangeMemberRole))
	mux.Handle("DELETE /api/companies/{cid}/members/{user_id}", s.api(s.apiRemoveMember))

	mux.Handle("GET /companies/{cid}/members", s.page(s.membersPage))
	mux.Handle("POST /companies/{cid}/members", s.page(s.addMemberForm))
	mux.Handle("POST /companies/{cid}/members/{user_id}/role", s.page(s.changeMemberRoleForm))
	mux.Handle("POST /companies/{cid}/members/{user_id}/remove", s.page(s.removeMemberForm))

	// Agents (changes: board members).
	mux.Handle("GET /api/companies/{cid}/agents", s.api(s.apiListAgents))
	mux.Handle("POST /api/companies/{cid}/agents", s.api(s.apiCreateAgent))
	mux.Handle("GET /api/agents/{id}", s.api(getObjectAPI(s, "agents", db.AgentByID, agentResponse)))
	mux.Handle("POST /api/agents/{id}/disable", s.api(s.apiDisableAgent))

	mux.Handle("GET /companies/{cid}/agents", s.page(s.agentsPage))
	mux.Handle("POST /companies/{cid}/agents", s.page(s.createAgentForm))
	mux.Handle("POST /companies/{cid}/agents/{id}/disable", s.page(s.disableAgentForm))

	// Audit trail.
	mux.Handle("GET /api/companies/{cid}/audit-events", s.api(s.apiListAudit))
	mux.Handle("GET /companies/{cid}/audit", s.page(s.auditPage))

	// Projects (changes: board members).
	mux.Handle("GET /api/companies/{cid}/projects", s.api(s.apiListProjects))
	mux.Handle("POST /api/companies/{cid}/projects", s.api(s.apiCreateProject))
	mux.Handle("GET /api/projects/{id}", s.api(getObjectAPI(s, "projects", db.ProjectByID, projectOut)))
	mux.Handle("PATCH /api/projects/{id}", s.api(s.apiPatchProject))

	mux.Handle("GET /companies/{cid}", s.page(s.projectsPage))
	mux.Handle("POST /companies/{cid}/projects", s.page(s.createProjectForm))
	mux.Handle("GET /projects/{id}", s.page(s.projectPage))
	mux.Handle("POST /projects/{id}", s.page(s.updateProjectForm))
	mux.Handle("POST /projects/{id}/archive", s.page(s.projectStatusForm(db.ProjectArchived)))
	mux.Handle("POST /projects/{id}/unarchive", s.page(s.projectStatusForm(db.ProjectActive)))

	// Project workspaces (changes: board members).
	mux.Handle("GET /api/projects/{id}/workspaces", s.api(s.apiListProjectWorkspaces))
	mux.Handle("POST /api/projects/{id}/workspaces", s.api(s.apiCreateProjectWorkspace))
	mux.Handle("GET /api/project-workspaces/{id}", s.api(getObjectAPI(s, "project_workspaces", db.ProjectWorkspaceByID, projectWorkspaceOut)))
	mux.Handle("PATCH /api/project-workspaces/{id}", s.api(s.apiPatchProjectWorkspace))
	mux.Handle("DELETE /api/project-workspaces/{id}", s.api(s.apiDeleteProjectWorkspace))

	mux.Handle("POST /projects/{id}/workspaces", s.page(s.createProjectWorkspaceForm))
	mux.Handle("GET /project-workspaces/{id}", s.page(s.projectWorkspacePage))
	mux.Handle("POST /project-workspaces/{id}", s.page(s.updateProjectWorkspaceForm))
	mux.Handle("POST /project-workspaces/{id}/primary", s.page(s.primaryProjectWorkspaceForm))
	mux.Handle("POST /project-workspaces/{id}/delete", s.page(s.deleteProjectWorkspaceForm))

	// Source roots: instance admins manage them; a board member refused a directory asks for it
	// (source_roots.go).
	mux.Handle("POST /api/projects/{id}/source-root-requests", s.api(s.sourceRootRequestAPI))
	mux.Handle("POST /projects/{id}/source-root-requests", s.page(s.sourceRootRequestForm))
	mux.Handle("GET /api/source-roots", s.api(s.sourceRootsAPI))
	mux.Handle("GET /admin/source-roots", s.page(s.sourceRootsPage))
	mux.Handle("POST /admin/source-roots", s.page(s.addSourceRootForm))
	mux.Handle("POST /admin/source-roots/{id}/remove", s.page(s.removeSourceRootForm))
	mux.Handle("POST /admin/source-root-requests/{id}/approve", s.page(s.resolveSourceRootRequestForm(true)))
	mux.Handle("POST /admin/source-root-requests/{id}/dismiss", s.page(s.resolveSourceRootRequestForm(false)))

	// Environments (changes: instance admins).
	mux.Handle("GET /api/companies/{cid}/environments", s.api(s.apiListEnvironments))
	mux.Handle("POST /api/companies/{cid}/environments", s.api(s.apiCreateEnvironment))
	mux.Handle("GET /api/environments/{id}", s.api(s.apiGetEnvironment))
	mux.Handle("PATCH /api/environments/{id}", s.api(s.apiPatchEnvironment))
	mux.Handle("POST /api/environments/{id}/probe", s.api(s.apiProbeEnvironment))
	mux.Handle("GET /api/environments/{id}/image-versions", s.api(s.apiListImageVersions))
	// Custom images: activate (rollback), setup sessions and their terminal (instance admins;
	// setup_sessions*.go). The WebSocket authenticates by its first frame's terminal token.
	mux.Handle("POST /api/environments/{id}/image-versions/{n}/activate", s.api(s.apiActivateImageVersion))
	mux.Handle("POST /api/environments/{id}/image-imports", s.api(s.apiImportImage))
	mux.Handle("POST /api/environments/{id}/image-setup-sessions", s.api(s.apiStartSetupSession))
	mux.Handle("GET /api/image-setup-sessions/{id}", s.api(s.apiGetSetupSession))
	mux.Handle("POST /api/image-setup-sessions/{id}/finish", s.api(s.apiFinishSetupSession))
	mux.Handle("POST /api/image-setup-sessions/{id}/cancel", s.api(s.apiCancelSetupSession))
	mux.Handle("POST /api/image-setup-sessions/{id}/terminal-token", s.api(s.apiMintTerminalToken))
	mux.Handle("GET /api/image-setup-sessions/{id}/terminal", s.handle(s.terminalSocket))

	mux.Handle("GET /companies/{cid}/environments", s.page(s.environmentsPage))
	mux.Handle("POST /companies/{cid}/environments", s.page(s.createEnvironmentForm))
	mux.Handle("GET /environments/{id}", s.page(s.environmentPage))
	mux.Handle("POST /environments/{id}", s.page(s.updateEnvironmentForm))
	mux.Handle("POST /environments/{id}/archive", s.page(s.archiveEnvironmentForm))
	mux.Handle("POST /environments/{id}/unarchive", s.page(s.unarchiveEnvironmentForm))
	mux.Handle("POST /environments/{id}/probe", s.page(s.probeEnvironmentForm))
	mux.Handle("POST /environments/{id}/image-versions/{n}/activate", s.page(s.activateImageVersionForm))
	mux.Handle("POST /environments/{id}/image-imports", s.page(s.importImageForm))
	mux.Handle("POST /environments/{id}/image-setup-sessions", s.page(s.startSetupSessionForm))
	mux.Handle("GET /image-setup-sessions/{id}", s.page(s.setupSessionPage))
	mux.Handle("POST /image-setup-sessions/{id}/finish", s.page(s.endSetupSessionForm(true)))
	mux.Handle("POST /image-setup-sessions/{id}/cancel", s.page(s.endSetupSessionForm(false)))

	// Tasks, effective plan, workspace binding (changes: board members).
	mux.Handle("GET /api/projects/{id}/tasks", s.api(s.listTasksAPI))
	mux.Handle("POST /api/projects/{id}/tasks", s.api(s.createTaskAPI))
	mux.Handle("GET /api/tasks/{id}", s.runAPI(getObjectAPI(s, "tasks", db.TaskByID, newTaskJSON)))
	mux.Handle("PATCH /api/tasks/{id}", s.api(s.patchTaskAPI))
	mux.Handle("GET /api/tasks/{id}/plan", s.runAPI(s.planAPI))
	mux.Handle("GET /api/tasks/{id}/workspace", s.runAPI(s.getBindingAPI))
	mux.Handle("PUT /api/tasks/{id}/workspace", s.runAPI(s.putBindingAPI))

	mux.Handle("GET /projects/{id}/tasks", s.page(s.taskListPage))
	mux.Handle("POST /projects/{id}/tasks", s.page(s.createTaskForm))
	mux.Handle("GET /tasks/{id}", s.page(s.taskPage))
	mux.Handle("POST /tasks/{id}", s.page(s.updateTaskForm))
	mux.Handle("GET /tasks/{id}/plan", s.page(s.planFragment))
	mux.Handle("POST /tasks/{id}/workspace", s.page(s.bindingForm))

	// File resources: read-only files of a task's authorized roots (any reader of the company);
	// reads share one per-user rate limit, in this process's memory (see file_resources.go).
	files := newFileRateLimiter(s.fileBurst)
	mux.Handle("GET /api/tasks/{id}/file-resources/roots", s.runAPI(s.fileRootsAPI))
	mux.Handle("GET /api/tasks/{id}/file-resources/list", s.runAPI(s.fileListAPI(files)))
	mux.Handle("GET /api/tasks/{id}/file-resources/content", s.runAPI(s.fileContentAPI(files)))
	// Changing files: board members, and a run token in its own workspace (file_resources_write.go).
	mux.Handle("PUT /api/tasks/{id}/file-resources/content", s.runAPI(s.fileWriteAPI(files)))
	mux.Handle("DELETE /api/tasks/{id}/file-resources/content", s.runAPI(s.fileDeleteAPI(files)))
	mux.Handle("POST /api/tasks/{id}/file-resources/edit", s.runAPI(s.fileEditAPI(files)))
	mux.Handle("GET /tasks/{id}/files", s.page(s.filesPage(files)))

	// The River UI (instance admins; anyone else the 404 of a page that does not exist; admin_jobs.go).
	if jobsUI != nil {
		guard := s.adminJobs(jobsUI)
		mux.Handle(adminJobsPrefix, guard)
		mux.Handle(adminJobsPrefix+"/", guard)
	}
	mux.Handle("GET /admin/workspaces", s.page(s.unmanagedPage))
	// Nodes (instance admins; anyone else 404; nodes.go).
	mux.Handle("GET /api/nodes", s.api(s.nodesAPI))
	mux.Handle("GET /admin/nodes", s.page(s.nodesPage))

	// Runs (start and cancel: board members).
	mux.Handle("POST /api/tasks/{id}/runs", s.api(s.createRunAPI))
	mux.Handle("GET /api/tasks/{id}/runs", s.api(s.taskRunsAPI))
	// A run token reads its own run, log and receipt (docs/security.md "Run tokens").
	mux.Handle("GET /api/runs/{id}", s.runAPI(s.getRunAPI))
	mux.Handle("GET /api/runs/{id}/log", s.runAPI(s.runLogAPI))
	mux.Handle("POST /api/runs/{id}/cancel", s.api(s.cancelRunAPI))

	mux.Handle("POST /tasks/{id}/runs", s.page(s.createRunForm))
	mux.Handle("GET /runs/{id}", s.page(s.runPage))
	mux.Handle("GET /runs/{id}/log", s.page(s.runLogDownload))
	mux.Handle("POST /runs/{id}/cancel", s.page(s.cancelRunForm))

	// Receipts and attempts (DESIGN §13; receipts.go, attempts*.go).
	mux.Handle("GET /api/runs/{id}/receipt", s.runAPI(s.runReceiptAPI))
	mux.Handle("POST /api/runs/{id}/receipt/verify", s.api(s.runReceiptVerifyAPI))
	mux.Handle("GET /runs/{id}/receipt", s.page(s.runReceiptDownload))
	mux.Handle("POST /api/tasks/{id}/attempts", s.api(s.createAttemptsAPI))
	mux.Handle("GET /api/tasks/{id}/attempts", s.api(s.taskAttemptsAPI))
	mux.Handle("POST /api/tasks/{id}/attempts/select", s.api(s.selectAttemptsAPI))
	mux.Handle("POST /api/tasks/{id}/attempts/discard", s.api(s.discardAttemptsAPI))
	mux.Handle("GET /tasks/{id}/attempts", s.page(s.attemptsPage))
	mux.Handle("POST /tasks/{id}/attempts", s.page(s.createAttemptsForm))
	mux.Handle("POST /tasks/{id}/attempts/select", s.page(s.selectAttemptForm))
	mux.Handle("POST /tasks/{id}/attempts/discard", s.page(s.discardAttemptsForm))

	// Execution workspaces: list, detail, ledger, close-readiness, close and reopen (changes:
	// board members), and a task's work products (execution_workspaces.go).
	mux.Handle("GET /api/companies/{cid}/execution-workspaces", s.api(s.listWorkspacesAPI))
	// A run token reads its own workspace and its ledger (docs/security.md "Run tokens"), nothing
	// else here.
	mux.Handle("GET /api/execution-workspaces/{id}", s.runAPI(s.getWorkspaceAPI))
	mux.Handle("PATCH /api/execution-workspaces/{id}", s.api(s.patchWorkspaceAPI))
	mux.Handle("GET /api/execution-workspaces/{id}/operations", s.runAPI(s.listOperationsAPI))
	mux.Handle("GET /api/execution-workspaces/{id}/operations/{op_id}/log", s.runAPI(s.operationLogAPI))
	mux.Handle("GET /api/execution-workspaces/{id}/close-readiness", s.api(s.closeReadinessAPI))
	mux.Handle("GET /api/tasks/{id}/work-products", s.api(s.taskWorkProductsAPI))
	mux.Handle("POST /api/tasks/{id}/work-products", s.runAPI(s.createWorkProductAPI)) // work_products.go

	// Runtime services and their previews (runtime_services.go, preview.go): a run token controls
	// its own workspace's services; the proxy admits members of the service's company.
	mux.Handle("GET /api/execution-workspaces/{id}/runtime-services", s.runAPI(s.listRuntimeServicesAPI))
	mux.Handle("POST /api/execution-workspaces/{id}/runtime-services/{action}", s.runAPI(s.runtimeServiceActionAPI))
	mux.Handle("POST /workspaces/{id}/services/{name}/{action}", s.page(s.runtimeServiceForm))
	// Berth's origin never serves a preview's bytes: it sends a member to the preview origin
	// with a ticket (preview_origin.go, handlers/preview).
	mux.Handle("GET /preview/{id}", s.handle(s.previewRedirect))
	mux.Handle("GET /preview/{id}/", s.handle(s.previewRedirect))

	mux.Handle("GET /companies/{cid}/workspaces", s.page(s.workspacesPage))
	mux.Handle("GET /workspaces/{id}", s.page(s.workspacePage))
	mux.Handle("POST /workspaces/{id}/close", s.page(s.workspaceFormAction(true)))
	mux.Handle("POST /workspaces/{id}/reopen", s.page(s.workspaceFormAction(false)))

	// Environment leases (force release and retry cleanup: instance admins).
	mux.Handle("GET /api/companies/{cid}/leases", s.api(s.apiListLeases))
	mux.Handle("GET /api/leases/{id}", s.api(getObjectAPI(s, "environment_leases", db.LeaseByID, newLeaseJSON)))
	mux.Handle("POST /api/leases/{id}/release", s.api(s.apiForceReleaseLease))
	mux.Handle("POST /api/leases/{id}/retry-cleanup", s.api(s.apiRetryLeaseCleanup))

	mux.Handle("GET /leases", s.page(s.leasesPage))
	mux.Handle("GET /leases/{id}", s.page(s.leasePage))
	mux.Handle("POST /leases/{id}/release", s.page(s.forceReleaseLeaseForm))
	mux.Handle("POST /leases/{id}/retry-cleanup", s.page(s.retryLeaseCleanupForm))

	// Berth for agents: the Model Context Protocol over this same route table, with a bearer
	// token only (mcp_endpoint.go, handlers/mcp, docs/mcp.md).
	agents := s.mcpEndpoint(mux)
	mux.Handle("POST /mcp", agents)
	mux.Handle("GET /mcp", agents)
	mux.Handle("DELETE /mcp", agents)

	mux.Handle("/api/", s.handle(func(w http.ResponseWriter, r *http.Request) error { return errNotFound }))
	mux.Handle("/", s.handle(func(w http.ResponseWriter, r *http.Request) error { return errNotFound }))
	return mux
}

// internalRoutes is the internal listener's route table: signed forwarded previews, terminals,
// workspace git facts and file-resource reads, nothing else (internal.go checks the signature
// before any of them runs).
func (s *Server) internalRoutes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/internal/preview/{id}/", http.HandlerFunc(s.internalPreview))
	mux.Handle("GET /internal/image-setup-sessions/{id}/terminal", s.handle(s.terminalSocket))
	mux.Handle("GET /internal/workspaces/{id}/git", http.HandlerFunc(s.internalWorkspaceGit)) // internal_workspace.go
	files := newFileRateLimiter(s.fileBurst)                                                  // file_resources_forward.go
	mux.Handle("GET /internal/tasks/{id}/file-resources/list", s.internalFiles(s.fileListAPI(files)))
	mux.Handle("GET /internal/tasks/{id}/file-resources/content", s.internalFiles(s.fileContentAPI(files)))
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]string{"code": "not_found", "message": "Not found."}})
	}))
	return mux
}
