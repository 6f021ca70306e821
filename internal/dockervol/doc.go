// Package dockervol is nvidia-docker 1.0's Docker volume plugin: Docker
// asks it, over a unix socket, for the volume nvidia_driver_<version>, and
// it answers with a directory holding that driver version's programs and
// libraries (bin/, lib/, lib64/: package drivervol), which Docker binds into
// the container, read-only at /usr/local/nvidia in the arguments
// /docker/cli gives:
//
//	docker run --volume-driver=nvidia-docker \
//	    --volume=nvidia_driver_580.159.04:/usr/local/nvidia:ro \
//	    --device=/dev/nvidiactl --device=/dev/nvidia-uvm --device=/dev/nvidia0 IMAGE
//
// The plugin's name is nvidia-docker: Docker finds it by its socket,
// /run/docker/plugins/nvidia-docker.sock (plugin discovery), and speaks
// JSON over HTTP POST (Accept: application/vnd.docker.plugins.v1.x+json;
// a request naming another media type is refused with 406, as the original
// did). The endpoints:
//
//	/Plugin.Activate            {"Implements": ["VolumeDriver"]}
//	/VolumeDriver.Create        builds the tree of this host's driver version; a
//	                            name of another version is refused ("invalid volume version")
//	/VolumeDriver.Remove        deletes the tree of that version
//	/VolumeDriver.Mount, .Path  the tree's directory as Mountpoint (Mount of this host's
//	                            version builds it again if it was removed behind Docker's back)
//	/VolumeDriver.Unmount       nothing to do
//	/VolumeDriver.Get, .List    the trees that exist, as {Name, Mountpoint}
//	/VolumeDriver.Capabilities  {"Capabilities": {"Scope": "local"}}
//	/docker/cli/json (GET)      the REST API's docker run arguments (package legacyapi),
//	                            when gantry serve gives its handler (Options.DockerCLI): the
//	                            nvidia-docker wrapper asks here, on a socket only root can
//	                            make at this path, and never on a TCP port
//
// Volume names are <volume>_<version>, and the one volume is nvidia_driver;
// other names are answered with "unsupported volume" or "bad volume format".
// Errors are answered as the protocol wants them: status 200 and the text
// in Err.
//
// The trees outlive the plugin: a restarted plugin lists and mounts the
// same directories, and Docker's containers keep the volumes they had.
//
// The volume is read-only only where the mount says so (:ro, which
// /docker/cli and the nvidia-docker wrapper always give): the plugin
// protocol does not tell the plugin how Docker will mount it, and the
// tree's files are hard links of the host's driver files when both are on
// one filesystem.
package dockervol
