package handlers

import (
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"berth/db"
	"berth/views"
)

// The runtime services rows of a project workspace's edit form. Row i posts services[i].name,
// services[i].command and so on, the same keys as the API's field errors, so a refusal's
// messages land under the fields that caused them. The last row is blank and adds a service when
// its name or command is filled; a row with Remove checked is dropped.

// serviceForm is the services part of a posted edit form.
type serviceForm struct {
	// Present: the form carried service rows (services_rows); without them the services are kept.
	Present bool
	// Rows are the posted rows that are not blank, in order: what the form shows again.
	Rows []views.ProjectServiceFormValues
	// Inputs are the rows to store (Rows without the removed ones); Index[j] is Inputs[j]'s row.
	Inputs []serviceInput
	Index  []int
	// Problems are values that are not even numbers, keyed by row.
	Problems map[string]string
}

// readServiceForm reads the service rows of an edit form.
func readServiceForm(form url.Values) serviceForm {
	sf := serviceForm{Problems: map[string]string{}}
	n, err := strconv.Atoi(form.Get("services_rows"))
	if err != nil || n < 0 {
		return sf
	}
	sf.Present = true
	if n > maxWorkspaceServices+1 {
		sf.Problems["services"] = fmt.Sprintf("at most %d services per workspace", maxWorkspaceServices)
		return sf
	}
	for i := range n {
		get := func(member string) string { return form.Get(fmt.Sprintf("services[%d].%s", i, member)) }
		row := views.ProjectServiceFormValues{Name: strings.TrimSpace(get("name")),
			Command: strings.ReplaceAll(get("command"), "\r\n", "\n"), PortEnv: strings.TrimSpace(get("port_env")),
			HealthPath: strings.TrimSpace(get("health_path")), ReadyTimeoutS: strings.TrimSpace(get("ready_timeout_s")),
			StopPolicy: get("stop_policy"), Lifecycle: get("lifecycle"), StripPrefix: formChecked(get("strip_prefix")),
			IdleTimeoutM: strings.TrimSpace(get("idle_timeout_m")), Remove: formChecked(get("remove"))}
		if get("new") != "" && row.Name == "" && strings.TrimSpace(row.Command) == "" {
			continue // the blank row, left blank: adds nothing
		}
		at := len(sf.Rows)
		sf.Rows = append(sf.Rows, row)
		if row.Remove {
			continue
		}
		in := serviceInput{Name: row.Name, Command: row.Command, PortEnv: row.PortEnv, HealthPath: row.HealthPath,
			StopPolicy: row.StopPolicy, Lifecycle: row.Lifecycle, StripPrefix: new(row.StripPrefix)}
		key := func(member string) string { return fmt.Sprintf("services[%d].%s", at, member) }
		if row.ReadyTimeoutS != "" {
			v, err := strconv.Atoi(row.ReadyTimeoutS)
			if err != nil {
				sf.Problems[key("ready_timeout_s")] = "must be a whole number of seconds"
			}
			in.ReadyTimeoutS = &v
		}
		if row.IdleTimeoutM != "" {
			v, err := strconv.Atoi(row.IdleTimeoutM)
			if err != nil {
				sf.Problems[key("idle_timeout_m")] = "must be a whole number of minutes"
			}
			in.IdleTimeoutM = &v
		}
		sf.Inputs = append(sf.Inputs, in)
		sf.Index = append(sf.Index, at)
	}
	return sf
}

var serviceErrKeyRE = regexp.MustCompile(`^services\[(\d+)\]\.(.+)$`)

// rowErrors moves validation messages keyed by input (services[j].member) to the form row that
// posted input j, so each message shows under its own field.
func (sf serviceForm) rowErrors(fields map[string]string) map[string]string {
	out := make(map[string]string, len(fields))
	for k, v := range fields {
		if m := serviceErrKeyRE.FindStringSubmatch(k); m != nil {
			if j, err := strconv.Atoi(m[1]); err == nil && j < len(sf.Index) {
				k = fmt.Sprintf("services[%d].%s", sf.Index[j], m[2])
			}
		}
		out[k] = v
	}
	return out
}

// serviceFormRows are stored definitions as the edit form's rows.
func serviceFormRows(list []db.ServiceDefinition) []views.ProjectServiceFormValues {
	rows := make([]views.ProjectServiceFormValues, 0, len(list))
	for _, d := range list {
		row := views.ProjectServiceFormValues{Name: d.Name, Command: d.Command, PortEnv: d.PortEnv, HealthPath: d.HealthPath,
			ReadyTimeoutS: strconv.Itoa(d.ReadyTimeoutS), StopPolicy: d.StopPolicy, Lifecycle: d.Lifecycle,
			StripPrefix: d.StripPrefix == nil || *d.StripPrefix}
		if d.IdleTimeoutM > 0 {
			row.IdleTimeoutM = strconv.Itoa(d.IdleTimeoutM)
		}
		rows = append(rows, row)
	}
	return rows
}

// formChecked reads a checkbox's value.
func formChecked(v string) bool { return v == "true" || v == "on" || v == "1" }
