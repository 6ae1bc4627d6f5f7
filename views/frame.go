// Package views holds Berth's templ components: the page frame, one file per resource with its
// page and the partials htmx swaps. Views take plain structs and never query.
package views

// Frame is what every full page needs besides its own content.
type Frame struct {
	Title   string
	Active  string // nav key of the current section: "dashboard", …
	Email   string // signed-in user's email; empty on public pages
	IsAdmin bool
	Version string
	Assets  AssetURLs
}

// AssetURLs are the content-hashed URLs of the front-end files a page loads.
type AssetURLs struct {
	CSS  string
	HTMX string
	App  string
}

// NavItem is one entry of the top navigation.
type NavItem struct {
	Key   string
	Label string
	Href  string
}

// Nav is the top navigation; later capabilities add their sections here.
func Nav() []NavItem {
	return []NavItem{
		{Key: "dashboard", Label: "Dashboard", Href: "/"},
	}
}
