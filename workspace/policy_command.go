package workspace

// CommandOverride reports whether a run may execute a command other than its task's (POST
// /api/tasks/{id}/runs {command}, the MCP tool run_start): only where the project allows task
// overrides, and never for a low-trust task, whose command is what its reviewer approved. why
// says which rule decided, for the refusal.
func CommandOverride(in PlanInput) (ok bool, why string) {
	switch {
	case in.TaskTrust == TrustLow:
		return false, "low trust: a run executes the task's own command"
	case !in.Policy.AllowTaskOverride:
		return false, "the project does not allow task overrides"
	}
	return true, "the project allows task overrides"
}
