package draplugin

import (
	"context"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gantry-gpu/gantry/internal/health"
)

// HealthResend is how often WatchHealthStatus repeats the whole report when
// nothing changed: the kubelet takes a device's health as unknown when it
// has not heard of it for 30 seconds.
const HealthResend = 10 * time.Second

// runHealth feeds the devices' health from the source (the same XID
// tracker the device plugin uses) until ctx is done. Every device starts
// healthy, as the source's own state does.
func (d *Driver) runHealth(ctx context.Context) {
	uuids := make([]string, 0, len(d.devices))
	for _, dev := range d.devices {
		if dev.UUID != "" { // IMEX channels and vfio GPUs have none
			uuids = append(uuids, dev.UUID)
		}
	}
	events := make(chan health.Event)
	done := make(chan error, 1)
	go func() { done <- d.healthSrc.Run(ctx, uuids, events) }()
	for {
		select {
		case e := <-events:
			d.setHealth(e)
		case err := <-done:
			if err != nil {
				// Without a source the plugin cannot vouch for any device:
				// the kubelet shows them as unknown.
				d.log.Error("device health checks stopped; the devices' health is now unknown", "err", err)
				d.hmu.Lock()
				d.healthOK = false
				d.healthChanged()
				d.hmu.Unlock()
			}
			return
		}
	}
}

func (d *Driver) setHealth(e health.Event) {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	for _, dev := range d.devices {
		if dev.UUID != e.UUID {
			continue
		}
		st := kubeletplugin.HealthStatusHealthy
		if !e.Healthy {
			st = kubeletplugin.HealthStatusUnhealthy
		}
		d.healthBy[dev.Slice.Name] = kubeletplugin.DeviceHealth{
			PoolName: d.pool, DeviceName: dev.Slice.Name, Health: st, LastUpdated: e.Time, Message: e.Reason,
		}
		d.log.Info("device health changed", "device", dev.Slice.Name, "uuid", dev.UUID, "healthy", e.Healthy, "reason", e.Reason)
	}
	d.healthChanged()
}

// healthChanged wakes the watchers; d.hmu is held.
func (d *Driver) healthChanged() {
	close(d.healthWake)
	d.healthWake = make(chan struct{})
}

// healthReport is every device's current health and the channel closed at
// the next change.
func (d *Driver) healthReport() (kubeletplugin.DeviceHealthReport, <-chan struct{}) {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	var r kubeletplugin.DeviceHealthReport
	now := time.Now()
	for _, dev := range d.devices {
		h, ok := d.healthBy[dev.Slice.Name]
		if !ok {
			h = kubeletplugin.DeviceHealth{PoolName: d.pool, DeviceName: dev.Slice.Name, Health: kubeletplugin.HealthStatusHealthy}
		}
		if !d.healthOK {
			h.Health, h.Message = kubeletplugin.HealthStatusUnknown, "device health checks stopped"
		}
		if h.LastUpdated.IsZero() || h.Health == kubeletplugin.HealthStatusHealthy {
			// Still watched, so still true now.
			h.LastUpdated = now
		}
		r.Devices = append(r.Devices, h)
	}
	return r, d.healthWake
}

// WatchHealthStatus sends the kubelet every device's health at once, again
// at every change, and every HealthResend in between. Without a health
// source (checks disabled) it declines, and the kubelet stops asking.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if d.healthSrc == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	resend := time.NewTicker(HealthResend)
	defer resend.Stop()
	for {
		r, wake := d.healthReport()
		select {
		case <-ctx.Done():
			return nil
		case reports <- r:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-resend.C:
		}
	}
}
