// Package jobstest seeds what the tests of jobs and jobs/services hang their work on, on a
// database of db/dbtest: the company Acme, a project in it, a local environment. Each helper
// makes one row with the fields every such test gives it and fails the test on an error; what
// varies (the project's policy) is an argument.
package jobstest

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"testing"

	"berth/db"
	"berth/environment"
)

// Company creates the company Acme (slug acme) and returns its id.
func Company(t testing.TB, q db.Querier) string {
	t.Helper()
	c, err := db.CreateCompany(context.Background(), q, "Acme", "acme")
	if err != nil {
		t.Fatal(err)
	}
	return c.ID
}

// Project creates the project P (key PRJ) in company with policy and returns its id.
func Project(t testing.TB, q db.Querier, company string, policy db.ExecutionPolicy) string {
	t.Helper()
	p, err := db.CreateProject(context.Background(), q, company, db.ProjectFields{Name: "P", Key: "PRJ", Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	return p.ID
}

// LocalEnvironment creates the environment "local" in company, the local driver with its
// default config, and returns its id.
func LocalEnvironment(t testing.TB, q db.Querier, company string) string {
	t.Helper()
	doc, err := environment.Config{Driver: "local"}.Document()
	if err != nil {
		t.Fatal(err)
	}
	env, err := db.CreateEnvironment(context.Background(), q, db.NewEnvironment{ID: UUID(), CompanyID: company,
		Name: "local", Driver: "local", Config: doc})
	if err != nil {
		t.Fatal(err)
	}
	return env.ID
}

// UUID is a random (version 4) UUID, for the ids a test gives rows and jobs itself.
func UUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Log is a logger that drops everything: the tests check rows and processes, not log lines.
func Log() *slog.Logger { return slog.New(slog.DiscardHandler) }
