package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"berth/db"
	"berth/environment"
	"berth/jobs"
	"berth/views"
)

// Environment pages: the list and detail pages and the view models they show (settings,
// qualification, the create and edit forms filled for a driver).

// environmentsPage lists a company's environments, with the creation form for instance admins
// (?driver= picks the form's driver).
func (s *Server) environmentsPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	a, err := s.companyAccess(ctx, p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	form := newEnvironmentForm(a.Company.ID, r.URL.Query().Get("driver"))
	return s.renderEnvironments(w, r, a, http.StatusOK, form)
}

// renderEnvironments renders the list page with the given creation form.
func (s *Server) renderEnvironments(w http.ResponseWriter, r *http.Request, a access, status int, form views.EnvironmentForm) error {
	envs, next, err := s.listEnvironmentPage(r.Context(), r, a)
	if err != nil {
		return err
	}
	d := views.EnvironmentsData{CompanyID: a.Company.ID, IsAdmin: a.Admin, New: form}
	for _, e := range envs {
		d.Rows = append(d.Rows, views.EnvironmentRow{ID: e.ID, Name: e.Name, Driver: e.Driver, Status: e.Status,
			Qualification: envQualificationView(e.Qualification)})
	}
	if next != "" {
		q := url.Values{"cursor": {next}}
		if limit := r.URL.Query().Get("limit"); limit != "" {
			q.Set("limit", limit)
		}
		d.NextURL = "/companies/" + a.Company.ID + "/environments?" + q.Encode()
	}
	w.Header().Set("Vary", "HX-Request")
	return s.renderStatus(w, r, status, views.EnvironmentsPage(s.companyFrame(r, a, "Environments", "environments"), d))
}

// environmentPage shows one environment (?driver= picks the edit form's driver).
func (s *Server) environmentPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	id := r.PathValue("id")
	r = s.live(r, "environment", id) // qualification and images follow it (events_pages.go)
	a, err := s.objectAccess(ctx, p, "environments", id)
	if err != nil {
		return err
	}
	env, err := db.EnvironmentByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	d, err := s.environmentView(ctx, a, env, r.URL.Query().Get("driver"))
	if err != nil {
		return err
	}
	return s.renderEnvironment(w, r, a, http.StatusOK, d)
}

// environmentView is what an environment's page shows, redacted, with the edit form for driver
// ("" for the stored one), the probe button for instance admins and, for a sandbox, its image
// versions.
func (s *Server) environmentView(ctx context.Context, a access, env db.Environment, driver string) (views.EnvironmentDetail, error) {
	cfg, err := environment.Load(env.Driver, env.Config)
	if err != nil {
		return views.EnvironmentDetail{}, err
	}
	var images views.EnvironmentImages
	if env.Driver == environment.DriverSandbox || env.Driver == environment.DriverPlugin {
		if images, err = s.envImageVersionsView(ctx, env.CompanyID, env.ID); err != nil {
			return views.EnvironmentDetail{}, err
		}
		images.Setup = true // sandbox sessions build layers; a plugin's is a shell in its image (setup_sessions_plugin.go)
		images.CanImport = a.Admin && s.jobs != nil
	}
	d := views.EnvironmentDetail{ID: env.ID, CompanyID: env.CompanyID, Name: env.Name, Driver: env.Driver,
		Status: env.Status, CreatedAt: env.CreatedAt, UpdatedAt: env.UpdatedAt, Settings: environmentSettingsView(cfg, images.Active),
		Qualification: envQualificationView(env.Qualification), IsAdmin: a.Admin, CanProbe: a.Admin && s.jobs != nil,
		Images: images, Edit: editEnvironmentForm(env, cfg, driver)}
	for _, v := range cfg.Env {
		d.Env = append(d.Env, views.EnvironmentVar{Name: v.Name, Value: v.Value, Secret: v.Secret})
	}
	return d, nil
}

// renderEnvironment renders an environment's page with status.
func (s *Server) renderEnvironment(w http.ResponseWriter, r *http.Request, a access, status int, d views.EnvironmentDetail) error {
	w.Header().Set("Vary", "HX-Request")
	return s.renderStatus(w, r, status, views.EnvironmentPage(s.companyFrame(r, a, d.Name, "environments"), d))
}

// environmentSettingsView phrases a configuration for the page; the private key only as "set".
// activeImage names a sandbox's active image version ("" when it has none).
func environmentSettingsView(c environment.Config, activeImage string) []views.EnvironmentSetting {
	return append(append(driverSettingsView(c, activeImage), egressSettingsView(c)...), parallelRunsSetting(c.MaxParallelRuns))
}

// parallelRunsSetting is the environment's capacity line.
func parallelRunsSetting(n int) views.EnvironmentSetting {
	if n == 0 {
		return views.EnvironmentSetting{Label: "Parallel runs", Value: "no limit", Hint: "Bounded only by the workers."}
	}
	return views.EnvironmentSetting{Label: "Parallel runs", Value: "at most " + strconv.Itoa(n),
		Hint: "More runs wait in the queue until one ends."}
}

// driverSettingsView is the settings of c's driver.
func driverSettingsView(c environment.Config, activeImage string) []views.EnvironmentSetting {
	switch c.Driver {
	case environment.DriverSSH:
		return []views.EnvironmentSetting{
			{Label: "Host", Value: c.SSH.Host, Mono: true},
			{Label: "Port", Value: strconv.Itoa(c.SSH.Port), Mono: true},
			{Label: "User", Value: c.SSH.User, Mono: true},
			{Label: "Private key", Secret: true, Hint: "Encrypted at rest; never shown."},
			{Label: "Host key", Value: c.SSH.HostKey, Mono: true, Hint: environment.HostKeyFingerprint(c.SSH.HostKey)},
		}
	case environment.DriverSandbox:
		sb := c.Sandbox
		return []views.EnvironmentSetting{
			{Label: "Network in runs", Value: envOnOff(sb.Network)},
			{Label: "Network in setup sessions", Value: envOnOff(sb.SetupNetwork)},
			{Label: "Memory", Value: strconv.Itoa(sb.MemoryMB) + " MiB"},
			{Label: "CPUs", Value: strconv.FormatFloat(sb.CPUs, 'f', -1, 64)},
			{Label: "Processes at most", Value: strconv.Itoa(sb.PidsMax)},
			{Label: "Time limit", Value: strconv.Itoa(sb.TimeoutS) + " s"},
			envActiveImageSetting(activeImage),
		}
	case environment.DriverPlugin:
		pc := c.Plugin
		return []views.EnvironmentSetting{
			{Label: "Plugin", Value: pc.Name, Mono: true, Hint: "An executable in BERTH_PLUGIN_DIR; the probe names its version."},
			{Label: "SHA-256 pin", Value: pc.SHA256, Mono: true, Hint: "Berth refuses to run the file when its digest differs."},
			{Label: "Plugin settings", Value: string(pc.Settings), Mono: true},
			{Label: "Time limit", Value: strconv.Itoa(pc.TimeoutS) + " s"},
			envPluginImageSetting(activeImage),
		}
	default:
		return []views.EnvironmentSetting{{Label: "Runs on", Value: "this machine, as the user Berth runs as"}}
	}
}

// envPluginImageSetting is a plugin environment's active image line.
func envPluginImageSetting(active string) views.EnvironmentSetting {
	if active == "" {
		return views.EnvironmentSetting{Label: "Active image", Value: "none", Hint: "Import an OCI image below; the plugin runs leases from it."}
	}
	return views.EnvironmentSetting{Label: "Active image", Value: active, Mono: true, Hint: "Sent to the plugin, which runs each lease from it."}
}

// envActiveImageSetting is the sandbox's active image line.
func envActiveImageSetting(active string) views.EnvironmentSetting {
	if active == "" {
		return views.EnvironmentSetting{Label: "Active image", Value: "none",
			Hint: "Sandboxes run with an empty /opt/image until a version is active."}
	}
	return views.EnvironmentSetting{Label: "Active image", Value: active, Mono: true, Hint: "Mounted read-only at /opt/image in runs."}
}

func envOnOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// envQualificationView phrases a stored qualification (the document the probe job writes); an
// unreadable one counts as failed.
func envQualificationView(raw []byte) views.EnvironmentQualification {
	if len(raw) == 0 || string(raw) == "null" {
		return views.EnvironmentQualification{State: "none"}
	}
	var q jobs.Qualification
	if err := json.Unmarshal(raw, &q); err != nil {
		return views.EnvironmentQualification{State: "failed", Summary: "The stored qualification cannot be read."}
	}
	state := "failed"
	if q.OK {
		state = "ok"
	}
	v := views.EnvironmentQualification{State: state, ProbedAt: q.ProbedAt, Summary: q.Summary,
		Fingerprint: q.ConfigFingerprint, ImageDigest: q.ImageDigest, HostKey: q.Fingerprint}
	for _, c := range q.Checks {
		v.Checks = append(v.Checks, views.EnvironmentCheck{Name: c.Name, Status: string(c.Status), Detail: c.Detail})
	}
	return v
}

// newEnvironmentForm is the empty creation form for a driver (local unless another is asked for).
func newEnvironmentForm(companyID, driver string) views.EnvironmentForm {
	f := views.EnvironmentForm{ID: "new-environment", Action: "/companies/" + companyID + "/environments",
		FieldsURL: "/companies/" + companyID + "/environments"}
	setEnvironmentFormDriver(&f, driver)
	return f
}

// setEnvironmentFormDriver switches a form to a driver and fills that driver's defaults.
func setEnvironmentFormDriver(f *views.EnvironmentForm, driver string) {
	if !environment.ValidDriver(driver) {
		driver = environment.DriverLocal
	}
	f.Driver = driver
	f.Host, f.Port, f.User, f.HostKey, f.KeySet = "", "", "", "", false
	f.Network, f.SetupNet = false, true
	f.MemoryMB, f.CPUs, f.PidsMax, f.TimeoutS = "", "", "", ""
	f.Plugin, f.PluginSHA256, f.PluginSettings = "", "", ""
}

// editEnvironmentForm is the edit form filled from the stored config; for another driver
// (?driver=) the driver's defaults, with the variables kept. Secret values are never filled in.
func editEnvironmentForm(env db.Environment, cfg environment.Config, driver string) views.EnvironmentForm {
	f := views.EnvironmentForm{ID: "edit-environment", Action: "/environments/" + env.ID,
		FieldsURL: "/environments/" + env.ID, Edit: true, Name: env.Name}
	if driver == "" {
		driver = env.Driver
	}
	setEnvironmentFormDriver(&f, driver)
	var plain, secret []string
	for _, v := range cfg.Env {
		if v.Secret {
			secret = append(secret, v.Name)
		} else {
			plain = append(plain, v.Name+"="+v.Value)
		}
	}
	f.Env, f.SecretEnv = strings.Join(plain, "\n"), strings.Join(secret, "\n")
	f.Inject = injectLines(cfg.Env)
	if cfg.MaxParallelRuns > 0 {
		f.MaxParallelRuns = strconv.Itoa(cfg.MaxParallelRuns)
	}
	if f.Driver != env.Driver {
		return f
	}
	fillEgressForm(&f, cfg)
	switch cfg.Driver {
	case environment.DriverSSH:
		f.Host, f.Port, f.User, f.HostKey, f.KeySet = cfg.SSH.Host, strconv.Itoa(cfg.SSH.Port), cfg.SSH.User, cfg.SSH.HostKey, true
	case environment.DriverSandbox:
		sb := cfg.Sandbox
		f.Network, f.SetupNet = sb.Network, sb.SetupNetwork
		f.MemoryMB, f.CPUs = strconv.Itoa(sb.MemoryMB), strconv.FormatFloat(sb.CPUs, 'f', -1, 64)
		f.PidsMax, f.TimeoutS = strconv.Itoa(sb.PidsMax), strconv.Itoa(sb.TimeoutS)
	case environment.DriverPlugin:
		f.Plugin, f.PluginSHA256, f.PluginSettings = cfg.Plugin.Name, cfg.Plugin.SHA256, string(cfg.Plugin.Settings)
		f.TimeoutS = strconv.Itoa(cfg.Plugin.TimeoutS)
	}
	return f
}
