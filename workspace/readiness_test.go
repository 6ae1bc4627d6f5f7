package workspace

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const closeTestRef = "ws-0123456789abcdef0123456789abcdef"

// cleanClose is a managed, clean, finalized git worktree whose only task is done.
func cleanClose() CloseSnapshot {
	return CloseSnapshot{
		Workspace: CloseWorkspace{
			ID: "ew-1", Mode: ModeIsolated, Strategy: StrategyGitWorktree, Status: "ready", Generation: 3,
			Managed: true, RootRel: closeTestRef, Branch: "berth/PRJ-7", BaseRef: "refs/heads/main",
			CleanupCommand: "make clean", HostScriptsAllowed: true,
		},
		FinalizeState: FinalizeSettled,
		LinkedTasks:   []CloseTask{{ID: "t1", Key: "PRJ-7", Status: "done"}},
		Git:           &GitState{Readable: true, Branch: "berth/PRJ-7", Head: "0123456789abcdef0123456789abcdef01234567"},
	}
}

var closeActionOrder = []string{ActionStopServices, ActionRescueRef, ActionCleanupCommand, ActionRemoveDirectory, ActionGitWorktreeRemove, ActionArchiveRecord}

// hostPath finds an absolute path where a person would read one: at the start of a word or after a
// quote or '='. The root placeholder and the shell the cleanup command runs under are allowed.
var hostPath = regexp.MustCompile(`(^|[\s'"=(])/`)

func assertNoHostPath(t *testing.T, what, s string) {
	t.Helper()
	clean := strings.ReplaceAll(strings.ReplaceAll(s, WorkspacesPlaceholder+"/", ""), GitDirPlaceholder+"/", "")
	clean = strings.ReplaceAll(clean, "/bin/sh -c ", "")
	if hostPath.MatchString(clean) || strings.Contains(s, "/var/lib") {
		t.Errorf("%s holds an absolute path: %q", what, s)
	}
}

func codes(rs []CloseReason) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.Code)
	}
	return out
}

func kinds(as []PlannedAction) []string {
	out := []string{}
	for _, a := range as {
		out = append(out, a.Kind)
	}
	return out
}

func TestEvaluateClose(t *testing.T) {
	t.Parallel()
	var (
		full     = []string{ActionCleanupCommand, ActionRemoveDirectory, ActionGitWorktreeRemove, ActionArchiveRecord}
		rescued  = append([]string{ActionRescueRef}, full...)
		archived = []string{ActionArchiveRecord}
		none     = []string{}
	)
	dirty := func(s *CloseSnapshot) { s.Git.Dirty = 2 }
	unmerged := func(s *CloseSnapshot) { s.Git.Ahead = 2 }
	confirm := func(s *CloseSnapshot) { s.ConfirmDestructive = true }
	shared := func(s *CloseSnapshot) {
		s.Workspace.Mode, s.Workspace.Strategy, s.Workspace.RootRel, s.Workspace.Branch = ModeShared, StrategyShared, "", ""
	}
	all := func(muts ...func(*CloseSnapshot)) func(*CloseSnapshot) {
		return func(s *CloseSnapshot) {
			for _, m := range muts {
				m(s)
			}
		}
	}
	liveRun := func(s *CloseSnapshot) { s.Runs = []CloseRun{{ID: "run-1", Status: "running"}} }
	lease := func(s *CloseSnapshot) { s.Leases = []CloseLease{{ID: "lease-1", Status: "active"}} }
	openTask := func(s *CloseSnapshot) {
		s.LinkedTasks = append(s.LinkedTasks, CloseTask{ID: "t2", Key: "PRJ-8", Status: "in_progress"})
	}
	gitErr := func(s *CloseSnapshot) {
		s.Git, s.GitErr = nil, "fatal: not a git repository: /var/lib/berth/workspaces/"+closeTestRef
	}

	cases := []struct {
		name        string
		mut         func(*CloseSnapshot)
		state       string
		blockers    []string
		warnings    []string
		actions     []string
		destructive bool
	}{
		{"clean isolated worktree", nil, ReadinessReady, nil, nil, full, false},
		{"confirm on clean work changes nothing", confirm, ReadinessReady, nil, nil, full, false},
		{"dirty blocks", dirty, ReadinessBlocked, []string{BlockDirtyWorktree}, nil, full, true},
		{"dirty with confirm rescues first", all(dirty, confirm), ReadinessWithWarnings, nil, []string{WarnDestructiveConfirmed}, rescued, true},
		{"untracked only blocks", func(s *CloseSnapshot) { s.Git.Untracked = 1 }, ReadinessBlocked, []string{BlockDirtyWorktree}, nil, full, true},
		{"unmerged blocks", unmerged, ReadinessBlocked, []string{BlockUnmergedWork}, nil, full, true},
		{"unmerged with confirm warns", all(unmerged, confirm), ReadinessWithWarnings, nil, []string{WarnDestructiveConfirmed}, rescued, true},
		{"dirty and unmerged both listed", all(dirty, unmerged), ReadinessBlocked, []string{BlockDirtyWorktree, BlockUnmergedWork}, nil, full, true},
		{"merged and ahead is ready", func(s *CloseSnapshot) { s.Git.Ahead, s.Git.Merged = 2, true }, ReadinessReady, nil, nil, full, false},
		{"behind warns", func(s *CloseSnapshot) { s.Git.Behind = 3 }, ReadinessWithWarnings, nil, []string{WarnBehindBase}, full, false},
		{"shared deletes nothing", shared, ReadinessWithWarnings, nil, []string{WarnSharedWorkspace}, archived, false},
		{"shared with dirty work still deletes nothing", all(shared, dirty, unmerged), ReadinessWithWarnings, nil, []string{WarnSharedWorkspace}, archived, false},
		{"shared strategy alone counts as shared", func(s *CloseSnapshot) { s.Workspace.Strategy = StrategyShared }, ReadinessWithWarnings, nil, []string{WarnSharedWorkspace}, archived, false},
		{"shared with open task blocks", all(shared, openTask), ReadinessBlocked, []string{BlockOpenTasksBound}, []string{WarnSharedWorkspace}, archived, false},
		{"shared with services stops them", all(shared, func(s *CloseSnapshot) {
			s.Services = []CloseService{{ID: "s1", Name: "web", Status: "running", PGID: 42}}
		}), ReadinessWithWarnings, nil, []string{WarnSharedWorkspace, WarnServicesWillStop}, []string{ActionStopServices, ActionArchiveRecord}, false},
		{"running services stop first", func(s *CloseSnapshot) {
			s.Services = []CloseService{{ID: "s2", Name: "web", Status: "healthy", PGID: 42}, {ID: "s1", Name: "api", Status: "starting"}, {ID: "s3", Name: "old", Status: "stopped"}}
		}, ReadinessWithWarnings, nil, []string{WarnServicesWillStop}, append([]string{ActionStopServices, ActionStopServices}, full...), false},
		{"live run blocks", liveRun, ReadinessBlocked, []string{BlockLiveRun}, nil, full, false},
		{"live run blocks despite confirm", all(liveRun, confirm), ReadinessBlocked, []string{BlockLiveRun}, nil, full, false},
		{"queued run is live", func(s *CloseSnapshot) { s.Runs = []CloseRun{{ID: "run-1", Status: "queued"}} }, ReadinessBlocked, []string{BlockLiveRun}, nil, full, false},
		{"unknown run status counts as live", func(s *CloseSnapshot) { s.Runs = []CloseRun{{ID: "run-1", Status: ""}} }, ReadinessBlocked, []string{BlockLiveRun}, nil, full, false},
		{"ended runs do not block", func(s *CloseSnapshot) {
			s.Runs = []CloseRun{{ID: "a", Status: "succeeded"}, {ID: "b", Status: "failed"}, {ID: "c", Status: "cancelled"}, {ID: "d", Status: "timed_out"}}
		}, ReadinessReady, nil, nil, full, false},
		{"active lease blocks", lease, ReadinessBlocked, []string{BlockActiveLease}, nil, full, false},
		{"active lease blocks despite confirm", all(lease, confirm), ReadinessBlocked, []string{BlockActiveLease}, nil, full, false},
		{"releasing lease blocks", func(s *CloseSnapshot) { s.Leases = []CloseLease{{ID: "l", Status: "releasing"}} }, ReadinessBlocked, []string{BlockActiveLease}, nil, full, false},
		{"released leases do not block", func(s *CloseSnapshot) {
			s.Leases = []CloseLease{{ID: "a", Status: "released"}, {ID: "b", Status: "expired"}, {ID: "c", Status: "failed"}}
		}, ReadinessReady, nil, nil, full, false},
		{"finalize pending blocks", func(s *CloseSnapshot) { s.FinalizeState = FinalizePending }, ReadinessBlocked, []string{BlockFinalizePending}, nil, full, false},
		{"finalize pending blocks despite confirm", all(confirm, func(s *CloseSnapshot) { s.FinalizeState = FinalizePending }), ReadinessBlocked, []string{BlockFinalizePending}, nil, full, false},
		{"finalize failed blocks", func(s *CloseSnapshot) { s.FinalizeState = FinalizeFailed }, ReadinessBlocked, []string{BlockFinalizeFailed}, nil, full, false},
		{"finalize failed blocks despite confirm", all(confirm, dirty, func(s *CloseSnapshot) { s.FinalizeState = FinalizeFailed }),
			ReadinessBlocked, []string{BlockFinalizeFailed}, []string{WarnDestructiveConfirmed}, rescued, true},
		{"unknown finalize state blocks", func(s *CloseSnapshot) { s.FinalizeState = "weird" }, ReadinessBlocked, []string{BlockFinalizeFailed}, nil, full, false},
		{"no finalize yet is fine", func(s *CloseSnapshot) { s.FinalizeState = "" }, ReadinessReady, nil, nil, full, false},
		{"open bound task blocks", openTask, ReadinessBlocked, []string{BlockOpenTasksBound}, nil, full, false},
		{"open bound task blocks despite confirm", all(openTask, confirm), ReadinessBlocked, []string{BlockOpenTasksBound}, nil, full, false},
		{"done and cancelled tasks do not block", func(s *CloseSnapshot) {
			s.LinkedTasks = []CloseTask{{ID: "t1", Key: "PRJ-7", Status: "done"}, {ID: "t2", Key: "PRJ-8", Status: "cancelled"}}
		}, ReadinessReady, nil, nil, full, false},
		{"git unreadable blocks", gitErr, ReadinessBlocked, []string{BlockGitUnreadable}, nil, full, false},
		{"git unreadable blocks despite confirm", all(gitErr, confirm), ReadinessBlocked, []string{BlockGitUnreadable}, nil, full, false},
		{"git state marked unreadable blocks", func(s *CloseSnapshot) { s.Git = &GitState{Reason: "bad object HEAD"} }, ReadinessBlocked, []string{BlockGitUnreadable}, nil, full, false},
		{"worktree without git state blocks", func(s *CloseSnapshot) { s.Git = nil }, ReadinessBlocked, []string{BlockGitUnreadable}, nil, full, false},
		{"unmanaged root is never deleted", func(s *CloseSnapshot) { s.Workspace.Managed = false }, ReadinessBlocked, []string{BlockUnmanagedPath}, nil, archived, false},
		{"unmanaged root with dirty work is only unmanaged", all(dirty, func(s *CloseSnapshot) { s.Workspace.Managed = false }), ReadinessBlocked, []string{BlockUnmanagedPath}, nil, archived, false},
		{"absolute root is unmanaged", func(s *CloseSnapshot) { s.Workspace.RootRel = "/var/lib/berth/workspaces/" + closeTestRef }, ReadinessBlocked, []string{BlockUnmanagedPath}, nil, archived, false},
		{"escaping root is unmanaged", func(s *CloseSnapshot) { s.Workspace.RootRel = "../" + closeTestRef }, ReadinessBlocked, []string{BlockUnmanagedPath}, nil, archived, false},
		{"nested root is unmanaged", func(s *CloseSnapshot) { s.Workspace.RootRel = closeTestRef + "/sub" }, ReadinessBlocked, []string{BlockUnmanagedPath}, nil, archived, false},
		{"unknown strategy is unmanaged", func(s *CloseSnapshot) { s.Workspace.Strategy = "rsync" }, ReadinessBlocked, []string{BlockUnmanagedPath}, nil, archived, false},
		{"copy strategy has no git actions", func(s *CloseSnapshot) { s.Workspace.Strategy, s.Workspace.Branch, s.Git = StrategyCopy, "", nil },
			ReadinessReady, nil, nil, []string{ActionCleanupCommand, ActionRemoveDirectory, ActionArchiveRecord}, false},
		{"copy without cleanup command", func(s *CloseSnapshot) {
			s.Workspace.Strategy, s.Git, s.Workspace.CleanupCommand = StrategyCopy, nil, ""
		}, ReadinessReady, nil, nil, []string{ActionRemoveDirectory, ActionArchiveRecord}, false},
		{"blank cleanup command is none", func(s *CloseSnapshot) { s.Workspace.CleanupCommand = "  \n" }, ReadinessReady, nil, nil, full[1:], false},
		{"cleanup skipped for low trust", func(s *CloseSnapshot) { s.Workspace.HostScriptsAllowed = false },
			ReadinessWithWarnings, nil, []string{WarnCleanupCommandSkipped}, full[1:], false},
		{"no cleanup command, nothing skipped", func(s *CloseSnapshot) { s.Workspace.CleanupCommand, s.Workspace.HostScriptsAllowed = "", false },
			ReadinessReady, nil, nil, full[1:], false},
		{"already closed", func(s *CloseSnapshot) { s.Workspace.Status = "closed" }, ReadinessBlocked, []string{BlockAlreadyClosed}, nil, none, false},
		{"already closing", all(liveRun, dirty, func(s *CloseSnapshot) { s.Workspace.Status = "closing" }), ReadinessBlocked, []string{BlockAlreadyClosed}, nil, none, false},
		{"cleanup_failed may be closed again", func(s *CloseSnapshot) { s.Workspace.Status = "cleanup_failed" }, ReadinessReady, nil, nil, full, false},
		{"several blockers in a fixed order", all(dirty, unmerged, liveRun, lease, openTask, func(s *CloseSnapshot) {
			s.FinalizeState = FinalizeFailed
			s.Services = []CloseService{{ID: "s1", Name: "web", Status: "running"}}
		}), ReadinessBlocked,
			[]string{BlockLiveRun, BlockActiveLease, BlockFinalizeFailed, BlockOpenTasksBound, BlockDirtyWorktree, BlockUnmergedWork},
			[]string{WarnServicesWillStop}, append([]string{ActionStopServices}, full...), true},
		{"unmanaged and unreadable and live", all(gitErr, liveRun, func(s *CloseSnapshot) { s.Workspace.Managed = false }), ReadinessBlocked,
			[]string{BlockUnmanagedPath, BlockLiveRun, BlockGitUnreadable}, nil, archived, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := cleanClose()
			if tc.mut != nil {
				tc.mut(&s)
			}
			r := EvaluateClose(s)
			if r.State != tc.state {
				t.Errorf("state = %q, want %q (blockers %v, warnings %v)", r.State, tc.state, codes(r.BlockingReasons), codes(r.Warnings))
			}
			want := func(w []string) []string {
				if w == nil {
					return []string{}
				}
				return w
			}
			if got := codes(r.BlockingReasons); !reflect.DeepEqual(got, want(tc.blockers)) {
				t.Errorf("blockers = %v, want %v", got, tc.blockers)
			}
			if got := codes(r.Warnings); !reflect.DeepEqual(got, want(tc.warnings)) {
				t.Errorf("warnings = %v, want %v", got, tc.warnings)
			}
			if got := kinds(r.PlannedActions); !reflect.DeepEqual(got, tc.actions) {
				t.Errorf("actions = %v, want %v", got, tc.actions)
			}
			if r.DestructiveRequired != tc.destructive {
				t.Errorf("destructive_required = %v, want %v", r.DestructiveRequired, tc.destructive)
			}
			if r.Shared != (s.Workspace.Mode == ModeShared || s.Workspace.Strategy == StrategyShared) {
				t.Errorf("shared = %v for mode %q strategy %q", r.Shared, s.Workspace.Mode, s.Workspace.Strategy)
			}
			// Whatever the case: actions run in the documented order, every reason and action speaks
			// to a person, and nothing shows a host path.
			last := -1
			for _, a := range r.PlannedActions {
				i := indexOf(closeActionOrder, a.Kind)
				if i < last {
					t.Errorf("action %s out of order in %v", a.Kind, kinds(r.PlannedActions))
				}
				last = i
				if a.Label == "" || a.Command == "" {
					t.Errorf("action %s lacks a label or command: %+v", a.Kind, a)
				}
				assertNoHostPath(t, a.Kind+" command", a.Command)
				assertNoHostPath(t, a.Kind+" label", a.Label)
				if a.Kind == ActionGitWorktreeRemove && !strings.Contains(a.Command, GitDirPlaceholder+"/worktrees/") {
					t.Errorf("%s command does not name the registration by placeholder: %q", a.Kind, a.Command)
				}
				if a.Kind == ActionRemoveDirectory || a.Kind == ActionCleanupCommand {
					if !strings.Contains(a.Command, WorkspacesPlaceholder+"/"+closeTestRef) {
						t.Errorf("%s command does not name the root by placeholder: %q", a.Kind, a.Command)
					}
				}
			}
			for _, reason := range append(append([]CloseReason{}, r.BlockingReasons...), r.Warnings...) {
				if len(reason.Message) < 20 || !strings.HasSuffix(reason.Message, ".") {
					t.Errorf("%s message is not a sentence: %q", reason.Code, reason.Message)
				}
				assertNoHostPath(t, reason.Code+" message", reason.Message)
			}
		})
	}
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// TestWorkAtRisk pins the one rule both EvaluateClose and the close job apply before deleting a
// worktree.
func TestWorkAtRisk(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name            string
		g               GitState
		dirty, unmerged bool
	}{
		{"clean and merged", GitState{Readable: true, Merged: true}, false, false},
		{"behind only", GitState{Readable: true, Behind: 3, Merged: true}, false, false},
		{"uncommitted change", GitState{Readable: true, Dirty: 1, Merged: true}, true, false},
		{"untracked file", GitState{Readable: true, Untracked: 1, Merged: true}, true, false},
		{"unmerged commit", GitState{Readable: true, Ahead: 2}, false, true},
		{"ahead but merged", GitState{Readable: true, Ahead: 2, Merged: true}, false, false},
		{"both", GitState{Readable: true, Dirty: 1, Ahead: 1}, true, true},
	}
	for _, tc := range cases {
		if dirty, unmerged := tc.g.WorkAtRisk(); dirty != tc.dirty || unmerged != tc.unmerged {
			t.Errorf("%s: WorkAtRisk = %v %v, want %v %v", tc.name, dirty, unmerged, tc.dirty, tc.unmerged)
		}
	}
}

func TestEvaluateCloseCommands(t *testing.T) {
	t.Parallel()
	s := cleanClose()
	s.Git.Dirty, s.Git.Untracked = 1, 2
	s.ConfirmDestructive = true
	s.Workspace.CleanupCommand = "rm -rf 'build dir' && echo $HOME"
	s.Services = []CloseService{{ID: "s1", Name: "web", Status: "running", PGID: 4242}, {ID: "s2", Name: "my api", Status: "running"}}
	r := EvaluateClose(s)
	root := `"$BERTH_WORKSPACES"/` + closeTestRef
	want := []PlannedAction{
		{Kind: ActionStopServices, Command: `berth: stop service 'my api'`},
		{Kind: ActionStopServices, Command: `kill -TERM -- -4242`},
		{Kind: ActionRescueRef, Command: `git --git-dir="$BERTH_GIT_DIR" update-ref refs/berth/rescue/` + closeTestRef + `-<unix-time> <snapshot-commit> ''`},
		{Kind: ActionCleanupCommand, Command: `cd ` + root + ` && /bin/sh -c 'rm -rf '\''build dir'\'' && echo $HOME'`},
		{Kind: ActionRemoveDirectory, Command: `rm -rf -- ` + root},
		{Kind: ActionGitWorktreeRemove, Command: `rm -rf -- "$BERTH_GIT_DIR"/worktrees/` + closeTestRef},
		{Kind: ActionArchiveRecord, Command: `berth: archive execution workspace ew-1 generation 3`},
	}
	if len(r.PlannedActions) != len(want) {
		t.Fatalf("actions = %v, want %d", kinds(r.PlannedActions), len(want))
	}
	for i, w := range want {
		got := r.PlannedActions[i]
		if got.Kind != w.Kind || got.Command != w.Command {
			t.Errorf("action %d = %s %q, want %s %q", i, got.Kind, got.Command, w.Kind, w.Command)
		}
	}
	if l := r.PlannedActions[5].Label; !strings.Contains(l, "berth/PRJ-7 is kept") {
		t.Errorf("worktree label does not say the branch is kept: %q", l)
	}
	if l := r.PlannedActions[2].Label; !strings.Contains(l, "0123456789ab") {
		t.Errorf("rescue label does not name HEAD: %q", l)
	}
	if m := r.Warnings[0].Message; !strings.Contains(m, "refs/berth/rescue/"+closeTestRef+"-<unix-time>") {
		t.Errorf("destructive warning does not name the rescue ref: %q", m)
	}
	if got := r.RunningServices; len(got) != 2 || got[0].Name != "my api" || got[1].Name != "web" {
		t.Errorf("running services = %+v, want my api then web", got)
	}
}

func TestEvaluateCloseMessages(t *testing.T) {
	t.Parallel()
	s := cleanClose()
	s.Git.Dirty, s.Git.Untracked, s.Git.Ahead = 1, 3, 2
	s.Runs = []CloseRun{{ID: "run-b", Status: "running"}, {ID: "run-a", Status: "queued"}}
	s.LinkedTasks = []CloseTask{{ID: "t9", Key: "PRJ-9", Status: "todo"}, {ID: "t1", Key: "PRJ-1", Status: "done"}}
	r := EvaluateClose(s)
	msg := map[string]string{}
	for _, b := range r.BlockingReasons {
		msg[b.Code] = b.Message
	}
	for code, want := range map[string][]string{
		BlockLiveRun:        {"2 runs are", "run-a (queued), run-b (running)"},
		BlockOpenTasksBound: {"1 open task is", "PRJ-9 (todo)"},
		BlockDirtyWorktree:  {"1 file with uncommitted changes and 3 untracked files"},
		BlockUnmergedWork:   {"Branch berth/PRJ-7 has 2 commits not merged into refs/heads/main"},
	} {
		for _, w := range want {
			if !strings.Contains(msg[code], w) {
				t.Errorf("%s message %q lacks %q", code, msg[code], w)
			}
		}
	}
	s = cleanClose()
	s.Git, s.GitErr = nil, "fatal: cannot change to '/var/lib/berth/workspaces/x': No such file\nor directory"
	m := EvaluateClose(s).BlockingReasons[0].Message
	if strings.Contains(m, "/var/lib") || strings.Contains(m, "\n") || !strings.Contains(m, "'<path>'") {
		t.Errorf("git error not redacted: %q", m)
	}
}

func TestEvaluateCloseDeterministic(t *testing.T) {
	t.Parallel()
	build := func(reverse bool) CloseSnapshot {
		s := cleanClose()
		s.Runs = []CloseRun{{ID: "r1", Status: "running"}, {ID: "r2", Status: "queued"}}
		s.Leases = []CloseLease{{ID: "l1", Status: "active"}, {ID: "l2", Status: "acquiring"}}
		s.LinkedTasks = []CloseTask{{ID: "t1", Key: "PRJ-1", Status: "todo"}, {ID: "t2", Key: "PRJ-2", Status: "done"}, {ID: "t3", Key: "PRJ-3", Status: "in_review"}}
		s.Services = []CloseService{{ID: "s1", Name: "a", Status: "running"}, {ID: "s2", Name: "b", Status: "running", PGID: 7}}
		if reverse {
			slicesReverse(s.Runs)
			slicesReverse(s.Leases)
			slicesReverse(s.LinkedTasks)
			slicesReverse(s.Services)
		}
		return s
	}
	in := build(false)
	a := EvaluateClose(in)
	if !reflect.DeepEqual(in, build(false)) {
		t.Fatal("EvaluateClose changed its input")
	}
	if b := EvaluateClose(build(true)); !reflect.DeepEqual(a, b) {
		t.Fatalf("input order changed the answer:\n%+v\n%+v", a, b)
	}
	if keys := []string{a.LinkedTasks[0].Key, a.LinkedTasks[1].Key, a.LinkedTasks[2].Key}; !sort.StringsAreSorted(keys) {
		t.Errorf("linked tasks not sorted by key: %v", keys)
	}
}

func slicesReverse[T any](s []T) {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
}

func TestReadinessJSONShape(t *testing.T) {
	t.Parallel()
	keysOf := func(m map[string]any) []string {
		var k []string
		for key := range m {
			k = append(k, key)
		}
		sort.Strings(k)
		return k
	}
	decode := func(r Readiness) (map[string]any, string) {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m, string(b)
	}
	top := []string{"blocking_reasons", "destructive_required", "git", "linked_tasks", "planned_actions", "running_services", "shared", "state", "warnings"}

	// A copy workspace with nothing linked: no git object and every list present and empty.
	s := cleanClose()
	s.Workspace.Strategy, s.Workspace.CleanupCommand, s.Git, s.LinkedTasks = StrategyCopy, "", nil, nil
	m, raw := decode(EvaluateClose(s))
	if got := keysOf(m); !reflect.DeepEqual(got, top) {
		t.Fatalf("keys = %v, want %v", got, top)
	}
	for _, k := range []string{"blocking_reasons", "warnings", "linked_tasks", "running_services"} {
		if !strings.Contains(raw, `"`+k+`":[]`) {
			t.Errorf("%s is not an empty array in %s", k, raw)
		}
	}
	if m["git"] != nil {
		t.Errorf("git = %v, want null for a copy", m["git"])
	}
	if m["state"] != "ready" || m["destructive_required"] != false || m["shared"] != false {
		t.Errorf("state/destructive_required/shared = %v/%v/%v", m["state"], m["destructive_required"], m["shared"])
	}

	// Everything filled in: nested objects have exactly their documented keys.
	s = cleanClose()
	s.Git.Dirty = 1
	s.Runs = []CloseRun{{ID: "r1", Status: "running"}}
	s.Services = []CloseService{{ID: "s1", Name: "web", Status: "running", PGID: 9}}
	m, _ = decode(EvaluateClose(s))
	nested := map[string][]string{
		"blocking_reasons": {"code", "message"},
		"warnings":         {"code", "message"},
		"linked_tasks":     {"id", "key", "open", "status"},
		"running_services": {"id", "name", "status"},
		"planned_actions":  {"command", "kind", "label"},
	}
	for list, want := range nested {
		items, ok := m[list].([]any)
		if !ok || len(items) == 0 {
			t.Fatalf("%s = %v, want a non-empty array", list, m[list])
		}
		if got := keysOf(items[0].(map[string]any)); !reflect.DeepEqual(got, want) {
			t.Errorf("%s item keys = %v, want %v", list, got, want)
		}
	}
	g, ok := m["git"].(map[string]any)
	if !ok {
		t.Fatalf("git = %v, want an object", m["git"])
	}
	if got, want := keysOf(g), []string{"ahead", "behind", "dirty", "merged", "readable", "untracked"}; !reflect.DeepEqual(got, want) {
		t.Errorf("git keys = %v, want %v", got, want)
	}
	if g["dirty"] != float64(1) || g["readable"] != true {
		t.Errorf("git = %v", g)
	}
	if m["state"] != "blocked" || m["destructive_required"] != true {
		t.Errorf("state = %v, destructive_required = %v", m["state"], m["destructive_required"])
	}
}

func TestCloseShellWord(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "plain-word_1.2/x", "a b", "it's", "$HOME", "`id`", "a\nb", "-rf", `back\slash`, "*", "~", "'", "é ü"} {
		out, err := exec.Command("/bin/sh", "-c", "printf '%s' "+shellWord(s)).Output()
		if err != nil {
			t.Fatalf("sh with %q: %v", shellWord(s), err)
		}
		if string(out) != s {
			t.Errorf("shellWord(%q) = %s reads back as %q", s, shellWord(s), out)
		}
	}
}

// TestEvaluateCloseCommandsRun runs the literal commands of a close against a real worktree, with
// BERTH_WORKSPACES pointing at the managed base: cleanup runs in the root, the worktree is
// unregistered, the directory is gone and the task branch is kept.
func TestEvaluateCloseCommandsRun(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	m := newTestManager(t)
	repo := newRepo(t, nil)
	res, err := m.RealizeGitWorktree(ctx, GitWorktreeSpec{Source: repo, TaskKey: "PRJ-7"})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(m.Base(), res.Cwd)
	snap := func() CloseSnapshot {
		st, err := m.GitState(ctx, res.Ref, res.BaseRef)
		if err != nil {
			t.Fatal(err)
		}
		s := cleanClose()
		s.Workspace.RootRel, s.Workspace.Branch, s.Workspace.BaseRef = res.Cwd, res.Branch, res.BaseRef
		s.Workspace.CleanupCommand = "printf done > '../cleanup ran'"
		s.Git = &st
		return s
	}
	writeFiles(t, root, map[string]string{"new.txt": "work\n"})
	if r := EvaluateClose(snap()); !reflect.DeepEqual(codes(r.BlockingReasons), []string{BlockDirtyWorktree}) {
		t.Fatalf("dirty worktree: blockers = %v", codes(r.BlockingReasons))
	}
	runGit(t, m, res.Ref, "add", "-A")
	runGit(t, m, res.Ref, "commit", "-q", "-m", "work")
	if err := m.BringHome(ctx, res.Ref); err != nil {
		t.Fatal(err)
	}
	if r := EvaluateClose(snap()); !reflect.DeepEqual(codes(r.BlockingReasons), []string{BlockUnmergedWork}) {
		t.Fatalf("unmerged branch: blockers = %v", codes(r.BlockingReasons))
	}
	gitT(t, repo, "merge", "-q", "--ff-only", res.Branch)
	r := EvaluateClose(snap())
	if r.State != ReadinessReady {
		t.Fatalf("merged branch: state = %s, blockers %v", r.State, codes(r.BlockingReasons))
	}
	for _, a := range r.PlannedActions {
		if strings.HasPrefix(a.Command, "berth: ") {
			continue // Berth's own steps, not shell commands
		}
		cmd := exec.CommandContext(ctx, "/bin/sh", "-c", a.Command)
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), "BERTH_WORKSPACES="+m.Base(), "BERTH_GIT_DIR="+filepath.Join(repo, ".git"), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %q: %v\n%s", a.Kind, a.Command, err, out)
		}
	}
	if got := mustRead(t, filepath.Join(m.Base(), "cleanup ran")); got != "done" {
		t.Errorf("cleanup output = %q", got)
	}
	if _, err := os.Lstat(root); !os.IsNotExist(err) {
		t.Errorf("root still exists: %v", err)
	}
	if list := gitT(t, repo, "worktree", "list", "--porcelain"); strings.Contains(list, res.Cwd) {
		t.Errorf("worktree still registered:\n%s", list)
	}
	gitT(t, repo, "rev-parse", "--verify", "refs/heads/"+res.Branch)
}
