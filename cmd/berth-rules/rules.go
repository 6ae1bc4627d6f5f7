package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// violation is one broken rule at one place.
type violation struct {
	Pos  token.Position
	Rule string
}

func (v violation) String() string {
	return fmt.Sprintf("%s:%d: %s", filepath.ToSlash(v.Pos.Filename), v.Pos.Line, v.Rule)
}

// Rule names, as printed.
const (
	ruleSQL    = "SQL text outside db/ (move the statement into a db function)"
	ruleInsert = "job inserted outside jobs.Enqueue (enqueue through jobs.Enqueue, which places the job)"
	ruleRoute  = "route registered outside handlers/routes.go (add it to the route table there)"
	ruleExec   = "os/exec imported in handlers/ (processes start in jobs or environment, in the jail)"
	rulePty    = "creack/pty imported outside environment/setupshell.go (a pty's process starts in the setup jail: environment.StartSetupShell)"
)

// sqlExempt are the files outside db/ allowed SQL text, by name: first-start bootstrap and demo
// seeding run before any db function could (they take the bootstrap advisory lock themselves),
// and the soak counts what must never happen from outside, as an operator's psql would.
var sqlExempt = map[string]bool{
	"cmd/berth/bootstrap.go":   true,
	"cmd/berth/demo.go":        true,
	"cmd/berth-soak/checks.go": true,
	"cmd/berth-soak/drive.go":  true,
}

// sqlText matches a string that is an SQL statement: a keyword at its start, in capitals, as
// the project writes them, followed by what that statement has next.
var sqlText = regexp.MustCompile(`^\s*(SELECT\s|INSERT\s+INTO\s|UPDATE\s+\w+\s+SET\s|DELETE\s+FROM\s|WITH\s+\w+\s+AS\s*\(|(CREATE|ALTER|DROP)\s+(TABLE|INDEX|TYPE|FUNCTION)\s)`)

// insertMethods are the River client's insert methods; only the enqueue door calls them.
var insertMethods = map[string]bool{"Insert": true, "InsertTx": true, "InsertMany": true, "InsertManyTx": true,
	"InsertManyFast": true, "InsertManyFastTx": true}

const (
	enqueueDoor = "jobs/nodes_queue.go"
	routeTable  = "handlers/routes.go"
	ptyDoor     = "environment/setupshell.go"
)

// ptyExempt are the files besides the pty door allowed creack/pty, by name: the podman plugin is
// a program of its own, whose terminal is podman exec into the lease's container (the plugin's
// containment, docs/plugins.md); Berth's side of it is environment.PluginTerminal, a stream.
var ptyExempt = map[string]bool{
	"cmd/berth-driver-podman/services.go": true,
}

// check walks root's Go files and returns every violation, in file order.
func check(root string) ([]violation, error) {
	var found []violation
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		found = append(found, checkFile(fset, rel, f)...)
		return nil
	})
	return found, err
}

// checkFile applies every rule to one parsed file; rel is its slash path from the root.
func checkFile(fset *token.FileSet, rel string, f *ast.File) []violation {
	var found []violation
	at := func(n ast.Node, rule string) {
		pos := fset.Position(n.Pos())
		pos.Filename = rel
		found = append(found, violation{Pos: pos, Rule: rule})
	}
	inDB := strings.HasPrefix(rel, "db/")
	inHandlers := strings.HasPrefix(rel, "handlers/")

	for _, imp := range f.Imports {
		switch p, _ := strconv.Unquote(imp.Path.Value); {
		case p == "os/exec" && inHandlers:
			at(imp, ruleExec)
		case (p == "github.com/creack/pty" || strings.HasPrefix(p, "github.com/creack/pty/")) && rel != ptyDoor && !ptyExempt[rel]:
			at(imp, rulePty)
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BasicLit:
			if n.Kind == token.STRING && !inDB && !sqlExempt[rel] {
				if s, err := strconv.Unquote(n.Value); err == nil && sqlText.MatchString(s) {
					at(n, ruleSQL)
				}
			}
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			switch name := sel.Sel.Name; {
			case insertMethods[name] && rel != enqueueDoor && len(n.Args) >= 3:
				at(n, ruleInsert)
			case (name == "Handle" || name == "HandleFunc") && rel != routeTable && len(n.Args) == 2 && isPattern(n.Args[0]):
				at(n, ruleRoute)
			case name == "NewServeMux" && rel != routeTable && isIdent(sel.X, "http"):
				at(n, ruleRoute)
			}
		}
		return true
	})
	return found
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// isPattern reports whether e reads as a ServeMux pattern: a string literal, a concatenation, or
// a named constant or variable, not a context (slog.Handler.Handle takes ctx first).
func isPattern(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Kind == token.STRING
	case *ast.BinaryExpr:
		return e.Op == token.ADD
	case *ast.Ident:
		return e.Name != "ctx"
	}
	return false
}
