package preview

import (
	"context"
	"sync"
	"time"

	"berth/db"
)

// A page of a dev server is dozens of requests, hundreds per second under HMR. Resolving the
// credential, the access check and the service row on each of them made the proxy a fraction of
// the server's own speed, so each is kept for at most grantTTL (docs/previews.md "Caching"):
//
//   - the viewer behind a bearer token or a preview cookie: a revoked token, a disabled user or
//     an ended run reaches a preview for at most one more second;
//   - the access check for (viewer, service generation), with the definition's strip_prefix: a
//     removed member is seen within the same second;
//   - the service row, used only while this node's supervisor confirms the service's process is
//     alive on the row's port. A live process keeps its port among the node's taken ports, so no
//     other service can hold that port meanwhile: a cached row never sends a request to another
//     service. Anything else (stopped, restarted, remote) reads the row.

// grantTTL is how long each cached fact is reused.
const grantTTL = time.Second

// cacheMax bounds each map; past it expired entries go first, then all.
const cacheMax = 4096

type cache struct {
	mu       sync.Mutex
	viewers  map[viewerKey]entry[Viewer]         // a bearer token's hash or a cookie's user
	grants   map[grantKey]entry[bool]            // (viewer, service generation) → strip
	services map[string]entry[db.RuntimeService] // service id
}

// viewerKey names a credential without building a string per request.
type viewerKey struct {
	token [32]byte // sha256 of a bearer token
	user  string   // or a preview cookie's user
}

// grantKey is one viewer's access check for one service generation.
type grantKey struct {
	run, id, svc string
	gen          int64
}

type entry[V any] struct {
	v     V
	until time.Time
}

func newCache() *cache {
	return &cache{viewers: map[viewerKey]entry[Viewer]{}, grants: map[grantKey]entry[bool]{},
		services: map[string]entry[db.RuntimeService]{}}
}

// get is m[key] while fresh.
func get[K comparable, V any](c *cache, m map[K]entry[V], key K, now time.Time) (V, bool) {
	c.mu.Lock()
	e, ok := m[key]
	c.mu.Unlock()
	if ok && now.Before(e.until) {
		return e.v, true
	}
	var zero V
	return zero, false
}

// put keeps v under key for grantTTL.
func put[K comparable, V any](c *cache, m map[K]entry[V], key K, v V, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(m) >= cacheMax {
		for k, e := range m {
			if now.After(e.until) {
				delete(m, k)
			}
		}
		if len(m) >= cacheMax {
			clear(m)
		}
	}
	m[key] = entry[V]{v: v, until: now.Add(grantTTL)}
}

// viewer is the cached viewer under key, or resolves and keeps it.
func (c *cache) viewer(key viewerKey, resolve func() (Viewer, error)) (Viewer, error) {
	now := time.Now()
	if v, ok := get(c, c.viewers, key, now); ok {
		return v, nil
	}
	v, err := resolve()
	if err != nil {
		return Viewer{}, err
	}
	put(c, c.viewers, key, v, now)
	return v, nil
}

// service is service id's row: the cached one while local confirms its process is alive on its
// port, else read from the database (and kept while it runs).
func (c *cache) service(ctx context.Context, q db.Querier, local LocalServices, id string) (db.RuntimeService, error) {
	now := time.Now()
	if local != nil {
		if svc, ok := get(c, c.services, id, now); ok {
			if port, alive := local.Serving(id); alive && port == svc.Port {
				return svc, nil
			}
		}
	}
	svc, err := db.RuntimeServiceForProxy(ctx, q, id)
	if err != nil || local == nil {
		return svc, err
	}
	if svc.Status == db.ServiceRunning && svc.Port != 0 {
		put(c, c.services, id, svc, now)
	} else {
		c.forget(id)
	}
	return svc, nil
}

// forget drops service id's row, after its upstream failed.
func (c *cache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.services, id)
}
