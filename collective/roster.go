package collective

// Announce is what a rank tells the rendezvous about itself.
type Announce struct {
	Rank  int    `json:"rank"`
	Size  int    `json:"size"`
	Host  string `json:"host"`
	Boot  string `json:"boot,omitempty"` // kernel boot id: same host iff equal
	PID   int    `json:"pid"`
	Nonce string `json:"nonce"`
	Addr  string `json:"addr,omitempty"` // tcp data listener
	// Shm is a random hex token of the shared-memory rings this rank
	// creates: mixed into their names with the job's secret (see shmNames)
	// and written in their header, where a peer checks it before it maps
	// one. Only the job's ranks learn it, from the roster.
	Shm string `json:"shm,omitempty"`
}

// Roster is the rendezvous' answer: every rank's Announce by rank, and the
// job's secret for data connections.
type Roster struct {
	Ranks  []Announce `json:"ranks,omitempty"`
	Secret []byte     `json:"secret,omitempty"`
	Error  string     `json:"error,omitempty"`
}

// SameHost reports whether every rank runs on one machine.
func (r *Roster) SameHost() bool {
	for _, a := range r.Ranks {
		if a.Host != r.Ranks[0].Host || a.Boot != r.Ranks[0].Boot {
			return false
		}
	}
	return true
}
