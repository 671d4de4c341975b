// The oracle header the planted kernel includes.
#pragma once
