package job

// DoneNotice is the completion notice published on DoneSubject(ID) when a
// job turns terminal (by a worker, or by the API for a job canceled while
// queued). Long-pollers wake on it and read the record; it is never the
// result itself.
type DoneNotice struct {
	ID     string `json:"id"`
	Status Status `json:"status"`
}
