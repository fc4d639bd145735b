// What a plugin of kind nan_policy includes: a NaN policy; NanDetector (nan_detector.h) included.
#pragma once

#include <ampkit/descriptor.h>
#include <ampkit/nan_detector.h>
#include <ampkit/nan_policy.h>
