package handlers

import (
	"context"
	"strings"
	"sync"
	"time"

	"berth/db"
)

// A proxied preview request is a dev server's asset, often dozens per page load and hundreds per
// second under HMR. Resolving its credential and its service row from the database on every one
// of them made the proxy a fraction of the server's own speed, so both are kept for at most
// previewGrantTTL (the same second the access check is kept for, docs/previews.md "Caching"):
//
//   - the principal behind a bearer token or a session's user, for /preview/ requests only: a
//     revoked token, a disabled user or a removed member reaches a preview for at most one more
//     second; every other route resolves the credential per request, as before;
//   - the service row, used only while this node's supervisor confirms that the service's
//     process is alive on the row's port. A live process keeps its port among the node's taken
//     ports, so no other service can hold that port meanwhile: a cached row never sends a request
//     to another service. Anything else (a stopped, restarted or remote service) reads the row.

// LocalServices is the runtime services this node's supervisor runs (jobs.Services); nil on a
// node without workers.
type LocalServices interface {
	// Serving is the port service id's live process listens on, false when this node runs none.
	Serving(id string) (port int, ok bool)
}

// previewCache is the proxy's short-lived memory of principals and service rows.
type previewCache struct {
	mu       sync.Mutex
	subjects map[string]cachedPrincipal // "token:"+hash or "user:"+id
	services map[string]cachedService   // service id
}

type cachedPrincipal struct {
	p     principal
	until time.Time
}

type cachedService struct {
	svc   db.RuntimeService
	until time.Time
}

// previewCacheMax bounds each map; past it expired entries go first, then all.
const previewCacheMax = 4096

func newPreviewCache() *previewCache {
	return &previewCache{subjects: map[string]cachedPrincipal{}, services: map[string]cachedService{}}
}

// isPreviewPath reports whether a request goes to the preview proxy.
func isPreviewPath(path string) bool { return strings.HasPrefix(path, "/preview/") }

// principal is the cached principal under key, or resolves and keeps it. A run principal's
// client address is the request's own, never the cached one.
func (c *previewCache) principal(key string, resolve func() (*principal, error)) (*principal, error) {
	now := time.Now()
	c.mu.Lock()
	e, ok := c.subjects[key]
	c.mu.Unlock()
	if ok && now.Before(e.until) {
		p := e.p
		if p.Run != nil {
			run := *p.Run
			p.Run = &run
		}
		return &p, nil
	}
	p, err := resolve()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	prune(c.subjects, now, func(e cachedPrincipal) time.Time { return e.until })
	c.subjects[key] = cachedPrincipal{p: *p, until: now.Add(previewGrantTTL)}
	return p, nil
}

// service is service id's row: the cached one while local confirms its process is alive on its
// port, else read from the database (and kept when it runs).
func (c *previewCache) service(ctx context.Context, q db.Querier, local LocalServices, id string) (db.RuntimeService, error) {
	now := time.Now()
	if local != nil {
		c.mu.Lock()
		e, ok := c.services[id]
		c.mu.Unlock()
		if ok && now.Before(e.until) {
			if port, alive := local.Serving(id); alive && port == e.svc.Port {
				return e.svc, nil
			}
		}
	}
	svc, err := db.RuntimeServiceForProxy(ctx, q, id)
	if err != nil || local == nil {
		return svc, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if svc.Status == db.ServiceRunning && svc.Port != 0 {
		prune(c.services, now, func(e cachedService) time.Time { return e.until })
		c.services[id] = cachedService{svc: svc, until: now.Add(previewGrantTTL)}
	} else {
		delete(c.services, id)
	}
	return svc, nil
}

// forget drops service id's row, after its upstream failed.
func (c *previewCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.services, id)
}

// prune keeps m under previewCacheMax: expired entries go first, then all. Callers hold the lock.
func prune[V any](m map[string]V, now time.Time, until func(V) time.Time) {
	if len(m) < previewCacheMax {
		return
	}
	for k, v := range m {
		if now.After(until(v)) {
			delete(m, k)
		}
	}
	if len(m) >= previewCacheMax {
		clear(m)
	}
}
