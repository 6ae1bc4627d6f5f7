// Package views holds Berth's templ components: the page frame, one file per resource with its
// page and the partials htmx swaps. Views take plain structs and never query.
package views

// Frame is what every full page needs besides its own content.
type Frame struct {
	Title string
	// Flash is the one-time confirmation of the form that led here ("" when none).
	Flash   string
	Active  string // nav key of the current section: "dashboard", "projects", "environments", …
	Email   string // signed-in user's email; empty on public pages
	IsAdmin bool
	Version string
	Assets  AssetURLs
	// Company is the company the page belongs to; nil on instance-level pages (dashboard).
	Company *CompanyNav
	// Events is the page's GET /events URL (docs/live.md): the body subscribes to it and the
	// page's live fragments re-fetch on its events; "" for a page that is not live.
	Events string
}

// CompanyNav is the company a page belongs to, and the caller's standing in it.
type CompanyNav struct {
	ID        string
	Name      string
	Slug      string
	Role      string // board, viewer, or "" for an instance admin who is not a member
	CanManage bool   // board member
	IsAdmin   bool   // instance admin
}

// AssetURLs are the content-hashed URLs of the front-end files a page loads.
type AssetURLs struct {
	CSS     string
	HTMX    string
	App     string
	Favicon string
	SSE     string // htmx's SSE extension (htmx-ext-sse)
}

// NavItem is one entry of the top navigation.
type NavItem struct {
	Key   string
	Label string
	Href  string
}

// Nav is the top navigation: the dashboard, the company's sections on a company page (Leases
// filtered to that company), and the instance admin's tools (River's job UI, unmanaged directories).
func Nav(f Frame) []NavItem {
	items := []NavItem{{Key: "dashboard", Label: "Dashboard", Href: "/"}}
	if c := f.Company; c != nil {
		base := "/companies/" + c.ID
		items = append(items,
			NavItem{Key: "leases", Label: "Leases", Href: "/leases?company_id=" + c.ID},
			NavItem{Key: "projects", Label: "Projects", Href: base},
			NavItem{Key: "workspaces", Label: "Workspaces", Href: base + "/workspaces"},
			NavItem{Key: "environments", Label: "Environments", Href: base + "/environments"},
			NavItem{Key: "agents", Label: "Agents", Href: base + "/agents"},
			NavItem{Key: "members", Label: "Members", Href: base + "/members"},
			NavItem{Key: "audit", Label: "Audit", Href: base + "/audit"},
		)
	} else {
		items = append(items, NavItem{Key: "leases", Label: "Leases", Href: "/leases"})
	}
	if f.IsAdmin {
		items = append(items,
			NavItem{Key: "admin-jobs", Label: "Jobs", Href: "/admin/jobs"},
			NavItem{Key: "admin-workspaces", Label: "Unmanaged dirs", Href: "/admin/workspaces"},
			NavItem{Key: "admin-nodes", Label: "Nodes", Href: "/admin/nodes"},
		)
	}
	return items
}
