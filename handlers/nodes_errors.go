package handlers

import (
	"errors"
	"net/http"

	"berth/jobs"
)

// nodeUnavailable turns a refusal to enqueue work for a down node's workspace into a 409
// node_unavailable that says what to do; other errors pass unchanged.
func nodeUnavailable(err error) error {
	var nu *jobs.NodeUnavailableError
	if !errors.As(err, &nu) {
		return err
	}
	return &httpError{Status: http.StatusConflict, Code: "node_unavailable",
		Message: "The task's workspace lives on node " + nu.Node + ", which is down. Start that node again, or close the workspace (it will be marked cleanup_failed) to run elsewhere."}
}
