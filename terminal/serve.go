package terminal

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"time"

	"github.com/gorilla/websocket"
)

// maxClientFrame bounds one client frame (keystrokes, a paste, a control message).
const maxClientFrame = 64 << 10

// Attach is what an accepted token admits a client to: the session's shell starter (used when no
// shell runs), its expiry and its transcript.
type Attach struct {
	Start      StartFunc
	Expires    time.Time
	Transcript io.Writer
}

// Refusal is a refused attach; Message is safe to show the client.
type Refusal struct{ Message string }

func (r *Refusal) Error() string { return "terminal refused: " + r.Message }

// Authorizer checks the token of a client's auth frame for one session. It must spend the token
// whatever it decides. A *Refusal's message goes to the client; any other error is reported as
// a generic refusal.
type Authorizer func(ctx context.Context, token string) (Attach, error)

// Serve runs the protocol of docs/terminal.md on an upgraded connection for session id, and
// returns when the client is gone: the first frame must be {"type":"auth","token":…} within the
// auth timeout, then binary frames are keystrokes and text frames JSON control (resize), while the
// server sends ready, the scrollback, live output and control frames. A refusal is an error
// frame and close code 1008. It returns the refusal, if any, for the caller's records.
func (r *Registry) Serve(ctx context.Context, conn *websocket.Conn, id string, auth Authorizer) error {
	conn.SetReadLimit(maxClientFrame)
	_ = conn.SetReadDeadline(time.Now().Add(r.opts.AuthTimeout))
	typ, msg, err := conn.ReadMessage()
	if err != nil {
		return refuse(conn, &Refusal{Message: "no auth frame within the time allowed"})
	}
	if typ != websocket.TextMessage {
		return refuse(conn, &Refusal{Message: "authenticate first: the first frame must be an auth frame"})
	}
	var f frame
	if err := json.Unmarshal(msg, &f); err != nil || f.Type != "auth" || f.Token == "" {
		return refuse(conn, &Refusal{Message: "the first frame must be {\"type\":\"auth\",\"token\":…}"})
	}
	a, err := auth(ctx, f.Token)
	if err != nil {
		var rf *Refusal
		if !errors.As(err, &rf) {
			rf = &Refusal{Message: "the terminal could not be opened"}
		}
		return refuse(conn, rf)
	}
	s, err := r.Open(id, a.Start, a.Expires, a.Transcript)
	if err != nil {
		return refuse(conn, &Refusal{Message: "the setup shell did not start"})
	}
	c := newClient(conn, s)
	old, err := s.attach(c)
	if err != nil {
		return refuse(conn, &Refusal{Message: "the setup session is closed"})
	}
	if old != nil {
		old.finish(frame{Type: "closed", Reason: ReasonReplaced})
	}
	go c.writeLoop()

	alive := 3 * r.opts.PingInterval
	_ = conn.SetReadDeadline(time.Now().Add(alive))
	conn.SetPongHandler(func(string) error { return conn.SetReadDeadline(time.Now().Add(alive)) })
	for {
		typ, msg, err := conn.ReadMessage()
		if err != nil {
			break
		}
		_ = conn.SetReadDeadline(time.Now().Add(alive))
		if typ == websocket.BinaryMessage {
			s.input(msg)
			continue
		}
		var f frame
		if err := json.Unmarshal(msg, &f); err != nil {
			c.control(frame{Type: "error", Message: "control frames are JSON objects"})
			continue
		}
		switch f.Type {
		case "resize":
			if err := s.resize(f.Cols, f.Rows); err != nil {
				c.control(frame{Type: "error", Message: "resize needs cols and rows between 1 and 1000"})
			}
		default:
			c.control(frame{Type: "error", Message: "unknown control frame"})
		}
	}
	s.detach(c)
	c.stop()
	<-c.done
	return nil
}

// refuse sends an error frame and closes with 1008 (policy violation).
func refuse(conn *websocket.Conn, rf *Refusal) error {
	deadline := time.Now().Add(time.Second)
	_ = conn.SetWriteDeadline(deadline)
	_ = conn.WriteMessage(websocket.TextMessage, frame{Type: "error", Message: rf.Message}.bytes())
	_ = conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.ClosePolicyViolation, rf.Message), deadline)
	conn.Close()
	return rf
}
