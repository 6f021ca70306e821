package containerhook

// The 32-bit fixtures, for applyedits_test.go (package containerhook_test).
var (
	NeedCompat32Exec = need32Exec
	Image32          = image32
	RunIn            = runIn
	Mkdirs           = mkdirs
	CopyFile         = copyFile
)

const (
	Probe32 = probe32
	Probe64 = probe64
)
