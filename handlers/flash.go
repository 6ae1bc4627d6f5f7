package handlers

import (
	"net/url"
	"strings"
)

// Flash messages: a form that succeeds redirects to its page with ?flash=<code>, and the page
// shows the sentence views.FlashMessage has for that code, once (app.js then drops the parameter
// from the address, so a reload does not repeat it). A code, not text: nobody can make a page say
// something else through a link. Not the session: scs re-saves a whole session on every request
// (idle timeout), so a fragment request racing the redirect would bring a popped message back.

// withFlash is path with the confirmation code for the page it leads to.
func withFlash(path, code string) string {
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return path + sep + "flash=" + url.QueryEscape(code)
}
