// Command berth-rules is the part of `make verify` that checks the house rules docs/handlers.md
// and docs/jobs.md write down, so they are not only written:
//
//   - SQL text lives in db/ (cmd/berth's bootstrap and demo seeding, and the soak's outside
//     counts, are excepted by name);
//   - jobs are inserted only through the enqueue door, jobs.Enqueue (jobs/nodes_queue.go), which
//     places each kind on its node;
//   - routes are registered only in handlers/routes.go, the one route table;
//   - handlers/ starts no process: no os/exec import.
//
// It reads the Go files under the directory given (default "."), skips tests and generated
// code, and prints one line per violation; it exits 1 if there is any.
package main

import (
	"fmt"
	"os"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	found, err := check(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "berth-rules:", err)
		os.Exit(2)
	}
	for _, v := range found {
		fmt.Println(v)
	}
	if len(found) > 0 {
		fmt.Fprintf(os.Stderr, "berth-rules: %d violation(s) of the house rules (docs/handlers.md \"Rules\")\n", len(found))
		os.Exit(1)
	}
}
