// gfx-check: inside a GPU container, does the image's EGL (libglvnd) find
// NVIDIA's EGL driver, and the image's Vulkan loader NVIDIA's ICD, the way
// applications do: libEGL.so.1 and libvulkan.so.1 by SONAME, the vendor and
// ICD files where the loaders look, the driver libraries they name through
// the container's ld.so.cache. Headless: EGL on an EGLDevice, no display.
// Built without any graphics headers (make gpu-e2e); everything is dlopen.
//
// Prints "egl vendor=... version=... devices=N" and "vulkan devices=N
// name=...", or what failed; exits 0 when EGL works (and Vulkan, when the
// image has its loader).
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void *(*getproc_fn)(const char *);
typedef unsigned (*query_devices_fn)(int, void **, int *);
typedef void *(*platform_display_fn)(unsigned, void *, const int *);
typedef unsigned (*initialize_fn)(void *, int *, int *);
typedef const char *(*query_string_fn)(void *, int);

#define EGL_VENDOR 0x3053
#define EGL_VERSION 0x3054
#define EGL_PLATFORM_DEVICE_EXT 0x313F

static int egl(void) {
	void *h = dlopen("libEGL.so.1", RTLD_NOW);
	if (!h) {
		printf("egl: %s\n", dlerror());
		return 1;
	}
	getproc_fn getproc = (getproc_fn)dlsym(h, "eglGetProcAddress");
	if (!getproc) {
		printf("egl: no eglGetProcAddress\n");
		return 1;
	}
	query_devices_fn query_devices = (query_devices_fn)getproc("eglQueryDevicesEXT");
	platform_display_fn display = (platform_display_fn)getproc("eglGetPlatformDisplayEXT");
	initialize_fn initialize = (initialize_fn)dlsym(h, "eglInitialize");
	query_string_fn query_string = (query_string_fn)dlsym(h, "eglQueryString");
	if (!query_devices || !display || !initialize || !query_string) {
		printf("egl: no EGL_EXT_device_enumeration/platform_device (no vendor library loaded?)\n");
		return 1;
	}
	void *devices[16];
	int n = 0;
	if (!query_devices(16, devices, &n) || n < 1) {
		printf("egl: no EGL device (%d)\n", n);
		return 1;
	}
	void *dpy = display(EGL_PLATFORM_DEVICE_EXT, devices[0], NULL);
	int major = 0, minor = 0;
	if (!dpy || !initialize(dpy, &major, &minor)) {
		printf("egl: eglInitialize failed on device 0 of %d\n", n);
		return 1;
	}
	printf("egl vendor=%s version=%s devices=%d\n", query_string(dpy, EGL_VENDOR), query_string(dpy, EGL_VERSION), n);
	return 0;
}

// The few Vulkan structures used, as the specification lays them out.
struct vk_instance_info {
	int type; // VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1
	const void *next;
	uint32_t flags;
	const void *app;
	uint32_t layers;
	const char *const *layer_names;
	uint32_t extensions;
	const char *const *extension_names;
};
typedef int (*vk_create_instance_fn)(const struct vk_instance_info *, const void *, void **);
typedef int (*vk_enumerate_fn)(void *, uint32_t *, void **);
typedef void (*vk_properties_fn)(void *, void *);
typedef void *(*vk_getproc_fn)(void *, const char *);

// vulkan: 0 works, 1 fails, 2 no loader in the image.
static int vulkan(void) {
	void *h = dlopen("libvulkan.so.1", RTLD_NOW);
	if (!h) {
		printf("vulkan: no loader in the image (%s)\n", dlerror());
		return 2;
	}
	vk_getproc_fn getproc = (vk_getproc_fn)dlsym(h, "vkGetInstanceProcAddr");
	vk_create_instance_fn create = getproc ? (vk_create_instance_fn)getproc(NULL, "vkCreateInstance") : NULL;
	if (!create) {
		printf("vulkan: no vkCreateInstance\n");
		return 1;
	}
	struct vk_instance_info info = {.type = 1};
	void *instance = NULL;
	int r = create(&info, NULL, &instance);
	if (r != 0) {
		printf("vulkan: vkCreateInstance returned %d (no ICD found?)\n", r);
		return 1;
	}
	vk_enumerate_fn enumerate = (vk_enumerate_fn)getproc(instance, "vkEnumeratePhysicalDevices");
	vk_properties_fn properties = (vk_properties_fn)getproc(instance, "vkGetPhysicalDeviceProperties");
	uint32_t n = 0;
	if (!enumerate || !properties || enumerate(instance, &n, NULL) != 0 || n == 0) {
		printf("vulkan: no physical device\n");
		return 1;
	}
	void *devices[16];
	if (n > 16) n = 16;
	enumerate(instance, &n, devices);
	// VkPhysicalDeviceProperties: five 32-bit fields, then deviceName[256].
	static unsigned char props[4096];
	properties(devices[0], props);
	printf("vulkan devices=%u name=%.256s\n", n, (const char *)props + 20);
	return 0;
}

int main(void) {
	int e = egl();
	int v = vulkan();
	return e != 0 || v == 1;
}
