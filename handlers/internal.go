package handlers

// The internal listener (DESIGN §11, docs/scaling.md "The internal address"): node-to-node
// requests only. A web node forwards a preview or a setup-session terminal whose process lives on
// another node to that node's internal listener, and asks it for the git state of a workspace on
// its disk (internal_workspace.go); every such request is signed with the
// node-to-node key (NodeKey), which is derived from Berth's secret key with a purpose label of
// its own. The signature covers the method, the request URI, the user header and a sha256 of the
// body (nodeBodyHeader), so a request altered on the way (its body included) does not verify.
// Anything unsigned, badly signed, stale, with a body other than the signed one, or for another
// route is refused: 401 without a valid signature, 404 for any other path. The listener carries
// no session and no API.

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"berth/db"
)

// nodeKeyLabel is the purpose label of the node-to-node key: it opens nothing else.
const nodeKeyLabel = "berth node-to-node request signing v1"

// nodeAuthHeader carries "<unix seconds>.<hex HMAC-SHA256(key, seconds \n method \n request URI
// \n user \n body sha256)>".
const nodeAuthHeader = "X-Berth-Node-Auth"

// nodeUserHeader names the user a web node authenticated for a forwarded preview (covered by
// the signature).
const nodeUserHeader = "X-Berth-Node-User"

// nodeBodyHeader carries the hex sha256 of the request body (of nothing, for a bodiless request).
const nodeBodyHeader = "X-Berth-Node-Body"

// maxNodeBody caps a forwarded request's body: both nodes hold it in memory to hash it before
// anything of it is used.
const maxNodeBody = 32 << 20

// errNodeBodyTooLarge refuses a forwarded request whose body is over maxNodeBody.
var errNodeBodyTooLarge = &httpError{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
	Message: "A request forwarded to another node may carry at most 32 MiB."}

// bufferNodeBody reads r's body (at most maxNodeBody) and puts it back as an in-memory reader.
func bufferNodeBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxNodeBody+1))
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	if len(body) > maxNodeBody {
		return nil, errNodeBodyTooLarge
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	if len(body) == 0 {
		r.Body = http.NoBody
	}
	return body, nil
}

// nodeAuthSkew is how far a signature's time may be from this node's clock.
const nodeAuthSkew = 60 * time.Second

// NodeKey derives the node-to-node key from Berth's secret key (BERTH_SECRET_KEY or the data
// dir's key file): HMAC-SHA256 keyed by the secret over a label no other key uses.
func NodeKey(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(nodeKeyLabel))
	return m.Sum(nil)
}

// nodeSignature is the signature of one request at unix time ts, over its user header and body
// digest too.
func nodeSignature(key []byte, ts int64, method, uri, user, bodySum string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(strconv.FormatInt(ts, 10) + "\n" + method + "\n" + uri + "\n" + user + "\n" + bodySum))
	return hex.EncodeToString(m.Sum(nil))
}

func bodyDigest(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// signNodeRequest signs r (its method, request URI, user header and body) for another node. The
// body is read into memory to be hashed (errNodeBodyTooLarge over maxNodeBody) and put back.
func signNodeRequest(r *http.Request, key []byte, now time.Time) error {
	body, err := bufferNodeBody(r)
	if err != nil {
		return err
	}
	sum := bodyDigest(body)
	r.Header.Set(nodeBodyHeader, sum)
	ts := now.Unix()
	r.Header.Set(nodeAuthHeader, strconv.FormatInt(ts, 10)+"."+
		nodeSignature(key, ts, r.Method, r.URL.RequestURI(), r.Header.Get(nodeUserHeader), sum))
	return nil
}

// verifyNodeRequest checks r's signature (constant-time) and its age, then reads the body
// (at most maxNodeBody) and checks it against the signed digest before anything else sees it.
func verifyNodeRequest(r *http.Request, key []byte, now time.Time) bool {
	if len(key) == 0 {
		return false
	}
	tsText, sig, ok := strings.Cut(r.Header.Get(nodeAuthHeader), ".")
	if !ok {
		return false
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil {
		return false
	}
	if d := now.Sub(time.Unix(ts, 0)); d > nodeAuthSkew || d < -nodeAuthSkew {
		return false
	}
	sum := r.Header.Get(nodeBodyHeader)
	want := nodeSignature(key, ts, r.Method, r.URL.RequestURI(), r.Header.Get(nodeUserHeader), sum)
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return false
	}
	body, err := bufferNodeBody(r)
	if err != nil {
		return false
	}
	return hmac.Equal([]byte(bodyDigest(body)), []byte(sum))
}

// errNodeSign is a request that could not be signed for another node (its body unreadable).
var errNodeSign = errors.New("sign node request")

// InternalHandler is the internal listener's handler: signed forwarded previews, terminals,
// workspace git facts and file-resource reads, nothing else.
func (s *Server) InternalHandler() http.Handler {
	mux := s.internalRoutes() // routes.go
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var key []byte
		if s.nodes != nil {
			key = s.nodes.Key
		}
		if !verifyNodeRequest(r, key, time.Now()) {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"error": map[string]string{
				"code": "unauthorized", "message": "Node-to-node requests only."}})
			return
		}
		r.Header.Del(nodeAuthHeader)
		r.Header.Del(nodeBodyHeader)
		mux.ServeHTTP(w, r)
	})
}

// internalPreview serves a preview a web node forwarded: as the user it names, through the same
// proxy (and the same membership check) as /preview/, on the node that runs the service.
func (s *Server) internalPreview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.PathValue("id")
	userID := r.Header.Get(nodeUserHeader)
	r.Header.Del(nodeUserHeader)
	u, err := db.UserByID(ctx, s.pool, userID)
	if err != nil || u.Disabled {
		s.renderError(w, r, errNotFound)
		return
	}
	svc, err := db.RuntimeServiceForProxy(ctx, s.pool, id)
	if err != nil || svc.NodeID != s.nodes.self() {
		s.renderError(w, r, errNotFound) // not here: never forward again (no loops)
		return
	}
	r2 := r.Clone(ctx)
	r2.URL.Path = "/" + strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/internal/preview/"+id), "/")
	r2.URL.RawPath = ""
	s.preview.ServeInternal(w, r2, id, u.ID)
}
